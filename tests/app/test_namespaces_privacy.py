"""An uploaded problem is private to its owner (the uploading key) and admins, in the API and on the dashboard, until
an admin publishes it; its owner or an admin can delete it (refused while audits of it are queued or running; its
submissions are kept). Before, any submit-only key published a problem on the public home page, for good.
Real Postgres and Redis, the API in process, a real Celery worker for the audit that has to finish."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from svc_support import bootstrap, start_worker, wait_for

from app.core.settings import Settings
from app.main import create_app

pytestmark = [pytest.mark.services, pytest.mark.slow]

DEFINITION: dict[str, Any] = {
    "name": "private_row_sum",
    "description": "Sum of each row of x times a scalar, in fp32.",
    "axes": {"rows": {"type": "var"}, "cols": {"type": "var"}},
    "inputs": {"x": {"shape": ["rows", "cols"], "dtype": "float32"}, "scale": {"shape": None, "dtype": "float32"}},
    "outputs": {"out": {"shape": ["rows"], "dtype": "float32"}},
    "reference": "import torch\n\n\ndef run(x, scale):\n    return (x.float() * scale).sum(-1)\n",
}
WORKLOADS = [
    {
        "uuid": "w-8-16",
        "axes": {"rows": 8, "cols": 16},
        "inputs": {"x": {"type": "random"}, "scale": {"type": "scalar", "value": 0.5}},
    }
]
SOLUTION: dict[str, Any] = {
    "name": "fp32_sum",
    "definition": DEFINITION["name"],
    "author": "alice",
    "spec": {
        "language": "python",
        "target_hardware": ["cpu"],
        "entry_point": "k.py::run",
        "destination_passing_style": False,
    },
    "sources": [{"path": "k.py", "content": "def run(x, scale):\n    return (x * scale).sum(-1)\n"}],
}


class Api:
    def __init__(self, client: TestClient, keys: dict[str, str]) -> None:
        self.client, self.keys = client, keys

    def h(self, who: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[who]}"} if who else {}

    def listed(self, who: str | None) -> set[str]:
        r = self.client.get("/v1/problems", headers=self.h(who))
        assert r.status_code == 200, r.text
        return {p["name"] for p in r.json()}

    def status(self, who: str | None, name: str) -> int:
        return self.client.get(f"/v1/problems/{name}", headers=self.h(who)).status_code

    def home_page(self) -> str:
        r = self.client.get("/")
        assert r.status_code == 200
        return r.text


@pytest.fixture
def world(service_settings: Settings, tmp_path: Path) -> Iterator[tuple[Api, Settings]]:
    settings = service_settings.model_copy(update={"uploads_dir": tmp_path / "uploads"})
    keys = bootstrap(settings)
    with TestClient(create_app(settings)) as client:
        yield Api(client, keys), settings


def test_an_upload_is_private_until_published_and_its_owner_can_delete_it(world, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    api, settings = world
    up = api.client.post(
        "/v1/definitions", json={"definition": DEFINITION, "workloads": WORKLOADS}, headers=api.h("alice")
    )
    assert up.status_code == 201, up.text
    address = up.json()["name"]
    assert up.json()["public"] is False

    # private: its owner and admins see it; nobody else, not even its existence
    assert address in api.listed("alice") and address in api.listed("admin")
    assert address not in api.listed("bob") and address not in api.listed(None)
    assert (api.status("alice", address), api.status("admin", address)) == (200, 200)
    assert (api.status("bob", address), api.status(None, address)) == (404, 404)
    assert DEFINITION["name"] not in api.home_page()
    assert api.client.get(f"/v1/leaderboard/{address}").status_code == 404
    bobs = api.client.post("/v1/submissions", json={**SOLUTION, "definition": address}, headers=api.h("bob"))
    assert (
        bobs.status_code == 404 and DEFINITION["name"] not in bobs.json()["detail"].split("known:")[1]
    )  # no private names

    # its owner submits against it (by its bare name); an audit queued: deleting it now is refused
    mine = api.client.post("/v1/submissions", json=SOLUTION, headers=api.h("alice"))
    assert mine.status_code == 202, mine.text
    busy = api.client.delete(f"/v1/problems/{address}", headers=api.h("alice"))
    assert busy.status_code == 409 and "queued or running" in busy.json()["detail"]

    # only an admin publishes; then everyone sees it, the dashboard lists it, and another key may submit to it
    assert api.client.post(f"/v1/problems/{address}/publish", headers=api.h("alice")).status_code == 403
    pub = api.client.post(f"/v1/problems/{address}/publish", headers=api.h("admin"))
    assert pub.status_code == 200 and pub.json()["public"] is True
    assert address in api.listed(None) and api.status("bob", address) == 200 and address in api.home_page()
    assert api.client.get(f"/v1/leaderboard/{address}").status_code == 200
    theirs = api.client.post("/v1/submissions", json={**SOLUTION, "definition": address}, headers=api.h("bob"))
    assert theirs.status_code == 202, theirs.text  # by its address, the only way another key names it
    assert api.client.delete(f"/v1/problems/{address}", headers=api.h("bob")).status_code == 403  # not bob's
    assert api.client.delete("/v1/problems/embedding_backward", headers=api.h("admin")).status_code == 409  # catalogue

    worker = start_worker(settings, tmp_path / "worker.log")
    try:

        def finished(sub: Any, who: str) -> Any:
            s = api.client.get(sub.json()["status_url"], headers=api.h(who)).json()
            return s if s["status"] not in ("queued", "running") else None

        for sub, who in ((mine, "alice"), (theirs, "bob")):
            s = wait_for(lambda: finished(sub, who), 180, "an audit did not finish", worker)  # noqa: B023
            assert s["status"] == "passed", s["summary"]  # named by address or bare name, intake knows the definition
    finally:
        worker.kill()

    gone = api.client.delete(f"/v1/problems/{address}", headers=api.h("alice"))
    assert gone.status_code == 204, gone.text
    assert address not in api.listed("alice") | api.listed("admin") | api.listed(None)
    assert (api.status("alice", address), api.status("admin", address)) == (404, 404)
    assert DEFINITION["name"] not in api.home_page()
    kept = api.client.get(mine.json()["status_url"], headers=api.h("alice"))  # its submission and results are kept
    assert kept.status_code == 200 and kept.json()["problem"] == address and kept.json()["stages"]
    again = api.client.post("/v1/submissions", json=SOLUTION, headers=api.h("alice"))
    assert again.status_code == 404  # nothing is audited against it any more

    # an admin deletes another key's upload; with no submissions its address is free again
    bob_up = api.client.post(
        "/v1/definitions", json={"definition": DEFINITION, "workloads": WORKLOADS}, headers=api.h("bob")
    )
    assert bob_up.status_code == 201 and bob_up.json()["name"] != address
    assert api.client.delete(f"/v1/problems/{bob_up.json()['name']}", headers=api.h("admin")).status_code == 204
    assert api.status("bob", bob_up.json()["name"]) == 404
    assert (
        api.client.post(
            "/v1/definitions", json={"definition": DEFINITION, "workloads": WORKLOADS}, headers=api.h("bob")
        ).status_code
        == 201
    )
