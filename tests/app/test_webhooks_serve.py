"""Under `kaudit serve`, webhooks have a worker of their own: with an audit running (one that takes minutes), a new
submission's `submission.received` reaches a real receiver at once. Behind the one worker it used to share with
audits, it waited for the running audit to end (three minutes late)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from svc_support import descendants, example, free_port, slow_import_solution, wait_for
from webhook_receiver import Receiver
import contextlib

pytestmark = pytest.mark.slow

AUDIT_S = 300  # how long the first audit holds the audit worker: far past every wait below


def _serve(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("KAUDIT_") and k not in ("DATABASE_URL", "REDIS_URL")
    }
    env.update(
        KAUDIT_WEBHOOK_ALLOWLIST="127.0.0.1/32",
        KAUDIT_CACHE_DIR=os.environ.get("KAUDIT_CACHE_DIR", str(tmp_path / "cache")),
    )
    out = tmp_path / "serve.out"
    with open(out, "wb") as fh:
        p = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "kaudit"),
                "serve",
                "--data-dir",
                str(tmp_path / "data"),
                "--port",
                str(free_port()),
                "--stages",
                "intake",
            ],
            cwd=tmp_path,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return p, out


def test_a_webhook_is_not_held_behind_a_running_audit(tmp_path: Path) -> None:
    p, out = _serve(tmp_path)
    below: list[int] = []
    try:
        wait_for(lambda: "admin API key" in out.read_text() or p.poll() is not None, 120, "no key printed")
        text = out.read_text()
        key = re.search(r"(ka_[A-Za-z0-9_-]+)", text).group(1)  # type: ignore[union-attr]
        url = re.search(r"running at (http://\S+)", text).group(1)  # type: ignore[union-attr]
        h = {"Authorization": f"Bearer {key}"}
        with Receiver() as rx:
            ep = httpx.post(
                url + "/v1/webhooks", json={"url": rx.url, "events": ["submission.received"]}, headers=h, timeout=10
            )
            assert ep.status_code == 201, ep.text
            slow = httpx.post(url + "/v1/submissions", json=slow_import_solution(AUDIT_S), headers=h, timeout=10)
            assert slow.status_code == 202, slow.text

            def status(r: httpx.Response) -> str:
                return str(httpx.get(url + r.json()["status_url"], headers=h, timeout=5).json()["status"])

            wait_for(lambda: status(slow) == "running", 120, "the long audit did not start")
            fast = httpx.post(url + "/v1/submissions", json=example("pytorch_fp32"), headers=h, timeout=10)
            assert fast.status_code == 202, fast.text
            rx.received(1, 60, lambda r: r.json["data"]["submission_id"] == fast.json()["id"])
            assert status(slow) == "running"  # the webhook came while the audit still ran
            assert status(fast) == "queued"  # behind it, on the one audit worker
    finally:
        below = descendants(p.pid)
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=60)
        for pid in below:  # the long audit's sandbox, if the workers' shutdown left it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
