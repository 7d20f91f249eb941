"""A real Celery worker with KAUDIT_SANDBOX_SPARE on (real uvicorn, Postgres, Redis): its pool process starts a
sandbox child before any audit, each audit takes the waiting one, and each child serves one audit only: after two
audits the only live child is a new spare, not one that served an audit."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from svc_support import bootstrap, example, start_api, start_worker, wait_for

from app.core.settings import Settings
from tests.proc_support import sandbox_children_under

pytestmark = [pytest.mark.services, pytest.mark.slow]


def _children(folder: Path) -> set[int]:
    """The sandbox children's Python processes only (isolated, bubblewrap's own processes name the child too)."""
    out = set()
    for pid in sandbox_children_under(folder):
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if b"python" in Path(argv0.decode(errors="replace")).name.encode():
            out.add(pid)
    return out


def _finished(url: str, key: str, sid: str):  # type: ignore[no-untyped-def]
    def check() -> dict[str, Any] | None:
        s = httpx.get(f"{url}/v1/submissions/{sid}", headers={"Authorization": f"Bearer {key}"}, timeout=5).json()
        return s if s["status"] not in ("queued", "running") else None

    return check


def test_each_audit_takes_the_spare_child_and_a_fresh_one_waits_for_the_next(
    service_settings: Settings, tmp_path: Path
) -> None:
    settings = service_settings.model_copy(
        update={
            "audit_stages": "intake,benchmark",
            "sandbox_spare": True,
            "isolation": "namespaces" if shutil.which("bwrap") else "none",
        }
    )
    keys = bootstrap(settings)
    api, url = start_api(settings, tmp_path / "api.log")
    sandboxes = tmp_path / "tmp"
    sandboxes.mkdir()
    worker = start_worker(settings, tmp_path / "worker.log", "spare", TMPDIR=str(sandboxes))
    try:
        wait_for(lambda: "ready." in worker.tail(), 300, "the worker never became ready", worker)
        # started by the pool process at its start, before any submission exists
        first = wait_for(lambda: _children(sandboxes) or None, 180, "no spare child was started", worker)
        assert len(first) == 1
        alice = {"Authorization": f"Bearer {keys['alice']}"}
        sids = []
        for _ in range(2):
            r = httpx.post(f"{url}/v1/submissions", json=example("pytorch_fp32"), headers=alice, timeout=30)
            assert r.status_code == 202, r.text
            sids.append(r.json()["id"])
        for sid in sids:
            s = wait_for(_finished(url, keys["alice"], sid), 300, "the audit did not finish", worker)
            assert s["status"] == "passed", s
        # the two audits' children are gone; the one left is the spare for the next audit, not the first spare
        left = wait_for(
            lambda: (c := _children(sandboxes)) and len(c) == 1 and c.isdisjoint(first) and c,
            120,
            "expected exactly one fresh spare child after two audits",
            worker,
        )
        assert len(left) == 1
    finally:
        worker.kill()
        api.kill()
