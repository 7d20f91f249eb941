"""Uploaded and catalogue problems live in separate namespaces: a tenant's upload named like a problem the catalogue
brings later keeps its own address, and the catalogue sync installs the catalogue's (it used to keep the tenant's).
Real Postgres, the API in process."""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
import sqlalchemy as sa
from sqlalchemy import insert, select
from svc_support import bootstrap

from app.core import migrate
from app.core.db import make_engine, utcnow
from app.core.settings import Settings
from app.main import create_app
from app.models import ApiKey, Problem, Submission

pytestmark = [pytest.mark.services]

REPO = Path(__file__).resolve().parents[2]
TENANT_DEFINITION: dict[str, Any] = {
    "name": "newprob",
    "description": "the tenant's: sum of each row of x times a scalar",
    "axes": {"rows": {"type": "var"}, "cols": {"type": "var"}},
    "inputs": {"x": {"shape": ["rows", "cols"], "dtype": "float32"}, "scale": {"shape": None, "dtype": "float32"}},
    "outputs": {"out": {"shape": ["rows"], "dtype": "float32"}},
    "reference": "import torch\n\n\ndef run(x, scale):\n    return (x.float() * scale).sum(-1)\n",
}
# the problems table as revision 0006 has it (the model's table has the columns 0007 adds)
PROBLEMS_0006 = sa.table(
    "problems",
    *(sa.column(c) for c in ("name", "description", "content_hash", "synced_at", "origin", "uploaded_by")),
    sa.column("definition", sa.JSON),
    sa.column("probes", sa.JSON),
    sa.column("bundle", sa.JSON),
)
WORKLOADS = [
    {
        "uuid": "w-8-16",
        "axes": {"rows": 8, "cols": 16},
        "inputs": {"x": {"type": "random"}, "scale": {"type": "scalar", "value": 0.5}},
    }
]


def _catalogue_with_newprob(root: Path) -> dict[str, Any]:
    """A catalogue folder holding one problem named `newprob` (the cumsum problem under that name)."""
    folder = root / "newprob"
    shutil.copytree(REPO / "kernels" / "cumsum", folder, ignore=shutil.ignore_patterns("solutions"))
    definition = json.loads((folder / "definition.json").read_text())
    definition["name"] = "newprob"
    (folder / "definition.json").write_text(json.dumps(definition))
    return definition


@pytest.fixture
def api(service_settings: Settings, tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str], dict[str, Any]]]:
    settings = service_settings.model_copy(update={"catalogue_root": tmp_path / "kernels"})
    catalogue_definition = _catalogue_with_newprob(tmp_path / "kernels")
    keys = bootstrap(settings)
    with TestClient(create_app(settings)) as client:
        yield client, {k: f"Bearer {v}" for k, v in keys.items()}, catalogue_definition


def _solution(definition: str, inputs: str) -> dict[str, Any]:
    return {
        "name": f"for_{definition.replace('@', '_')}",
        "definition": definition,
        "author": "alice",
        "spec": {
            "language": "python",
            "target_hardware": ["cpu"],
            "entry_point": "k.py::run",
            "destination_passing_style": False,
        },
        "sources": [{"path": "k.py", "content": f"def run({inputs}):\n    return None\n"}],
    }


def test_a_catalogue_sync_installs_the_catalogues_problem_over_a_squatted_name(api) -> None:  # type: ignore[no-untyped-def]
    client, keys, catalogue_definition = api
    up = client.post(
        "/v1/definitions",
        json={"definition": TENANT_DEFINITION, "workloads": WORKLOADS},
        headers={"Authorization": keys["alice"]},
    )
    assert up.status_code == 201, up.text
    mine = up.json()
    assert mine["name"].startswith("newprob@") and mine["name"] != "newprob" and mine["definition_name"] == "newprob"
    assert mine["namespace"] == mine["name"].split("@")[1] and mine["origin"] == "uploaded"

    sync = client.post("/v1/problems/sync", headers={"Authorization": keys["admin"]})
    assert sync.status_code == 200, sync.text
    assert sync.json()["added"] == ["newprob"]  # before: "unchanged", the tenant's definition kept

    for who in (None, keys["alice"], keys["bob"]):  # the bare name is the catalogue's, for everyone
        got = client.get("/v1/problems/newprob", headers={"Authorization": who} if who else {})
        assert got.status_code == 200, got.text
        d = got.json()["definition"]
        assert got.json()["origin"] == "catalogue" and (d["reference"], d["inputs"].keys()) == (
            catalogue_definition["reference"],
            catalogue_definition["inputs"].keys(),
        )
    own = client.get(f"/v1/problems/{mine['name']}", headers={"Authorization": keys["alice"]}).json()
    assert own["origin"] == "uploaded" and own["description"] == TENANT_DEFINITION["description"]

    # a solution naming `newprob` is audited against the catalogue's; naming the address, against the tenant's
    catalogue_inputs = ", ".join(catalogue_definition["inputs"])
    r = client.post(
        "/v1/submissions", json=_solution("newprob", catalogue_inputs), headers={"Authorization": keys["alice"]}
    )
    assert r.status_code == 202, r.text
    assert client.get(r.json()["status_url"], headers={"Authorization": keys["alice"]}).json()["problem"] == "newprob"
    r = client.post(
        "/v1/submissions", json=_solution(mine["name"], "x, scale"), headers={"Authorization": keys["alice"]}
    )
    assert r.status_code == 202, r.text
    assert (
        client.get(r.json()["status_url"], headers={"Authorization": keys["alice"]}).json()["problem"] == mine["name"]
    )

    # another key's upload of the same name lands in its own namespace: the two never meet
    other = copy.deepcopy(TENANT_DEFINITION)
    other["description"] = "bob's definition under the same name"
    theirs = client.post(
        "/v1/definitions", json={"definition": other, "workloads": WORKLOADS}, headers={"Authorization": keys["bob"]}
    )
    assert theirs.status_code == 201, theirs.text
    assert theirs.json()["name"] not in ("newprob", mine["name"]) and theirs.json()["name"].startswith("newprob@")
    # a second sync finds the catalogue's problem in place and leaves the uploads alone
    again = client.post("/v1/problems/sync", headers={"Authorization": keys["admin"]}).json()
    assert again["unchanged"] == ["newprob"] and again["reaudits"] == 0


def test_migration_moves_an_existing_upload_into_its_namespace(service_settings: Settings) -> None:
    """A database written before namespaces: its upload held a bare name. Migration 0007 moves it (and what
    refers to it) to `<name>@<namespace>`, private, so a catalogue problem of that name can come."""
    migrate.upgrade(service_settings, "0006")
    engine = make_engine(service_settings)
    key_id = "ab" * 16
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(ApiKey.__table__).values(
                    id=key_id, submitter="alice", prefix="ka_x", key_hash="h" * 64, scopes="submit", created_at=utcnow()
                )
            )
            conn.execute(
                insert(PROBLEMS_0006).values(
                    name="newprob",
                    description="legacy upload",
                    content_hash="c" * 64,
                    definition=TENANT_DEFINITION,
                    probes=[],
                    synced_at=utcnow(),
                    origin="uploaded",
                    bundle={"definition": TENANT_DEFINITION},
                    uploaded_by=key_id,
                )
            )
            conn.execute(
                insert(Submission.__table__).values(
                    id="s" * 32,
                    problem_name="newprob",
                    api_key_id=key_id,
                    submitter="alice",
                    solution_name="k",
                    source={},
                    source_hash="d" * 64,
                    created_at=utcnow(),
                )
            )
        migrate.upgrade(service_settings)
        with engine.connect() as conn:
            rows = conn.execute(select(Problem.name, Problem.namespace, Problem.public, Problem.origin)).all()
            assert rows == [(f"newprob@{key_id[:12]}", key_id[:12], False, "uploaded")]
            assert conn.scalar(select(Submission.problem_name)) == f"newprob@{key_id[:12]}"
        migrate.downgrade(service_settings, "0006")  # and back: the bare name again
        with engine.connect() as conn:
            assert conn.scalar(select(PROBLEMS_0006.c.name)) == "newprob"
            assert conn.scalar(select(Submission.problem_name)) == "newprob"
    finally:
        engine.dispose()
