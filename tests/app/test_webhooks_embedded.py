"""Webhooks in the embedded default: `kaudit serve` (SQLite, filesystem broker, one worker on the audit and webhook
queues) delivers a signed audit.completed to a real receiver on 127.0.0.1, allowlisted by the operator's setting."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from standardwebhooks import Webhook
from svc_support import example, free_port, wait_for
from webhook_receiver import Receiver

pytestmark = pytest.mark.slow


def test_kaudit_serve_delivers_signed_webhooks(tmp_path: Path) -> None:
    port = free_port()
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
                str(port),
                "--stages",
                "intake",
            ],
            cwd=tmp_path,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: "admin API key" in out.read_text(), 90, "no key printed")
        key = re.search(r"(ka_[A-Za-z0-9_-]+)", out.read_text()).group(1)  # type: ignore[union-attr]
        url, h = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {key}"}
        with Receiver() as rx:
            ep = httpx.post(
                url + "/v1/webhooks", json={"url": rx.url, "events": ["audit.completed"]}, headers=h, timeout=10
            )
            assert ep.status_code == 201, ep.text
            sub = httpx.post(url + "/v1/submissions", json=example("pytorch_fp32"), headers=h, timeout=10)
            assert sub.status_code == 202, sub.text
            (done,) = rx.received(1, 180)
            event = Webhook(ep.json()["secret"]).verify(done.body, done.headers)
            assert event["type"] == "audit.completed" and event["data"]["audit_id"] == sub.json()["audit_id"]
            assert event["data"]["verdict"] == "pass"
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=30)
