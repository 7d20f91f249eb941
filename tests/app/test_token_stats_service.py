"""Bring your own distribution through the service: token statistics POSTed with a submission reach the worker
(real uvicorn, Postgres, Redis and Celery worker), the probes draw their real-text ids from them and say so in
their evidence, and a re-audit keeps them."""

from __future__ import annotations

import base64
import io
import shutil
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from svc_support import bootstrap, example, start_api, start_worker, wait_for

from app.core.settings import Settings

pytestmark = [pytest.mark.services, pytest.mark.slow]


def _finished(url: str, key: str, sid: str, attempts: int = 1):  # type: ignore[no-untyped-def]
    def check() -> dict[str, Any] | None:
        s = httpx.get(f"{url}/v1/submissions/{sid}", headers={"Authorization": f"Bearer {key}"}, timeout=5).json()
        done = len(s["attempts"]) >= attempts and s["status"] not in ("queued", "running")
        return s if done else None

    return check


def _probes(view: dict[str, Any]) -> dict[str, Any]:
    return next(st for st in view["stages"] if st["name"] == "probes")


def test_the_probes_draw_from_the_submitted_token_stats_and_a_reaudit_keeps_them(
    service_settings: Settings, tmp_path: Path
) -> None:
    # isolated wherever bubblewrap is installed (CI); the token statistics are read on the trusted side either way
    settings = service_settings.model_copy(
        update={"audit_stages": "intake,probes", "isolation": "namespaces" if shutil.which("bwrap") else "none"}
    )
    keys = bootstrap(settings)
    api, url = start_api(settings, tmp_path / "api.log")
    worker = start_worker(settings, tmp_path / "worker.log")
    try:
        buf = io.BytesIO()
        np.save(buf, (np.arange(30_000) * 7 % 97).astype(np.int32))  # a sample of ids, all below 97
        body = {
            **example("pytorch_fp32"),
            "token_stats": {
                "kind": "sample",
                "format": "npy",
                "data_base64": base64.b64encode(buf.getvalue()).decode(),
            },
        }
        alice = {"Authorization": f"Bearer {keys['alice']}"}
        mine = httpx.post(f"{url}/v1/submissions", json=body, headers=alice, timeout=30)
        assert mine.status_code == 202, mine.text
        builtin = httpx.post(f"{url}/v1/submissions", json=example("pytorch_fp32"), headers=alice, timeout=30)
        assert builtin.status_code == 202, builtin.text

        s = wait_for(_finished(url, keys["alice"], mine.json()["id"]), 300, "the audit did not finish", worker)
        source = s["token_stats"]["source"]
        assert s["token_stats"]["kind"] == "sample" and s["token_stats"]["entries"] == 30_000
        probes = _probes(s)
        assert probes["status"] == "passed", probes["summary"]
        used = probes["evidence"]["token_stats"]
        assert used["source"] == source and used["kind"] == "sample" and used["ids"] == 30_000
        assert used["notes"] and all(f"user's token statistics (sample, {source})" in n for n in used["notes"])

        b = wait_for(_finished(url, keys["alice"], builtin.json()["id"]), 300, "the audit did not finish", worker)
        assert b["token_stats"] is None and "token_stats" not in _probes(b)["evidence"]  # the built-in text

        admin = {"Authorization": f"Bearer {keys['admin']}"}
        again = httpx.post(f"{url}/v1/submissions/{mine.json()['id']}/reaudit", headers=admin, timeout=30)
        assert again.status_code == 202, again.text
        r = wait_for(
            _finished(url, keys["admin"], mine.json()["id"], attempts=2), 300, "the re-audit did not finish", worker
        )
        assert r["attempts"][1]["audit_id"] == again.json()["audit_id"]
        assert _probes(r)["evidence"]["token_stats"]["source"] == source
    finally:
        worker.kill()
        api.kill()
