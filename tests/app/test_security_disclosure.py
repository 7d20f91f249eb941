"""One rule for a submission's private details, on the API and the dashboard alike: its exception, traceback,
printed output and host paths reach only the key that submitted it and admins; another tenant and anonymous
visitors see the verdict, the stage statuses and numbers. A real worker audits a submission that prints and raises
with markers at import, so the text checked for is what the engine itself stores."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from svc_support import bootstrap, example, kill_tree, start_worker, wait_for

from app.core.settings import Settings
from app.dashboard.access import COOKIE
from app.main import create_app

pytestmark = [pytest.mark.services, pytest.mark.slow]


def _leaky_solution(marker: str) -> dict[str, Any]:
    sol = example("pytorch_fp32")
    sol["name"] = "leaky_" + marker[:8]
    prelude = (
        f"import sys\nprint('PRINTED-{marker}')\nprint('STDERR-{marker}', file=sys.stderr)\n"
        f"raise RuntimeError('RAISED-{marker} in ' + __file__)\n"
    )
    sol["sources"][0]["content"] = prelude + sol["sources"][0]["content"]
    return sol


@contextmanager
def _dashboard(settings: Settings, key: str | None = None) -> Iterator[TestClient]:
    with TestClient(create_app(settings), base_url="http://dash.test") as c:
        if key is not None:
            r = c.post(
                "/key", data={"key": key, "next": "/"}, headers={"Origin": "http://dash.test"}, follow_redirects=False
            )
            assert r.status_code == 303 and COOKIE in c.cookies
        yield c


def _private_text(marker: str, text: str) -> list[str]:
    return [
        s
        for s in (
            f"RAISED-{marker}",
            f"PRINTED-{marker}",
            f"STDERR-{marker}",
            "Traceback",
            'solution.py", line',
            "/tmp/",
            "/home/",
            "/work/",
        )
        if s in text
    ]


def test_private_details_reach_only_the_owner_and_admins(service_settings: Settings, tmp_path: Path) -> None:
    keys = bootstrap(service_settings)
    marker = uuid.uuid4().hex
    worker = start_worker(service_settings, tmp_path / "worker.log")
    try:
        with TestClient(create_app(service_settings)) as api:
            alice = {"Authorization": f"Bearer {keys['alice']}"}
            sub = api.post("/v1/submissions", json=_leaky_solution(marker), headers=alice)
            assert sub.status_code == 202, sub.text
            sid = sub.json()["id"]
            done = wait_for(
                lambda: (s := api.get(f"/v1/submissions/{sid}", headers=alice).json())["status"]
                not in ("queued", "running")
                and s,
                240,
                "the audit did not finish",
                worker,
                every=0.5,
            )
            # the engine stored the submission's own text: this is what must stay private
            assert done["status"] == "failed" and f"RAISED-{marker}" in done["stages"][0]["summary"], done
            assert f"RAISED-{marker}" in str(done["stages"][0]["evidence"]) and f"RAISED-{marker}" in done["summary"]

            # the API: the owner and an admin read it, another tenant gets 404 and no key gets 401
            assert (
                api.get(f"/v1/submissions/{sid}", headers={"Authorization": f"Bearer {keys['admin']}"}).status_code
                == 200
            )
            other = api.get(f"/v1/submissions/{sid}", headers={"Authorization": f"Bearer {keys['bob']}"})
            assert other.status_code == 404 and not _private_text(marker, other.text)
            anon = api.get(f"/v1/submissions/{sid}")
            assert anon.status_code == 401 and not _private_text(marker, anon.text)

        pages = (f"/submissions/{sid}", f"/submissions/{sid}/live")
        locked = service_settings.model_copy(update={"dashboard_public": False})
        for settings, who in ((service_settings, None), (service_settings, keys["bob"]), (locked, keys["bob"])):
            with _dashboard(settings, who) as c:
                for path in pages:
                    r = c.get(path)
                    assert r.status_code == 200, (path, r.status_code)
                    assert not _private_text(marker, r.text), (who and "bob", path, _private_text(marker, r.text))
                    # the public part: verdict, the stage's status, its numbers
                    assert 'data-stage="intake" data-status="failed"' in r.text and "fail" in r.text
                    assert 'id="private-hidden"' in r.text and "source_bytes" in r.text
        for who in (keys["alice"], keys["admin"]):
            with _dashboard(locked, who) as c:
                for path in pages:
                    r = c.get(path)
                    assert r.status_code == 200 and f"RAISED-{marker}" in r.text and 'id="private-hidden"' not in r.text
        with _dashboard(locked) as c:
            assert c.get(pages[0]).status_code == 401
    finally:
        kill_tree(worker)
