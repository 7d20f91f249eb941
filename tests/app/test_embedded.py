"""The embedded default: `kaudit serve` on SQLite with no broker server; submit, audit, read the verdict, stop cleanly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from svc_support import descendants, example, free_port, wait_for

pytestmark = pytest.mark.slow


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_kaudit_serve_one_command(tmp_path: Path) -> None:
    port = free_port()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("KAUDIT_") and k not in ("DATABASE_URL", "REDIS_URL")
    }
    kaudit = Path(sys.executable).parent / "kaudit"
    out = tmp_path / "serve.out"
    with open(out, "wb") as fh:
        p = subprocess.Popen(
            [str(kaudit), "serve", "--data-dir", str(tmp_path / "data"), "--port", str(port), "--stages", "intake"],
            cwd=tmp_path,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(
            lambda: "admin API key" in out.read_text(), 90, f"no key printed: {out.read_text() if out.exists() else ''}"
        )
        text = out.read_text()
        assert f"http://127.0.0.1:{port}" in text and "embedding_backward" in text
        key = re.search(r"(ka_[A-Za-z0-9_-]+)", text).group(1)  # type: ignore[union-attr]
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _get(url + "/healthz") == 200, 60, "API not up")
        assert _get(url + "/docs") == 200 and _get(url + "/openapi.json") == 200
        h = {"Authorization": f"Bearer {key}"}
        src = example("pytorch_fp32")["sources"][0]["content"]
        r = httpx.post(
            url + "/v1/submissions",
            files={"file": ("fp32_kernel.py", src.encode())},
            data={"definition": "embedding_backward"},
            headers=h,
            timeout=10,
        )
        assert r.status_code == 202, r.text

        def done():  # type: ignore[no-untyped-def]
            s = httpx.get(url + r.json()["status_url"], headers=h, timeout=5).json()
            return s if s["status"] not in ("queued", "running") else None

        s = wait_for(
            done, 120, "embedded audit did not finish: " + (tmp_path / "data" / "worker.log").read_text()[-2000:]
        )
        assert s["status"] == "passed" and s["stages"][0]["name"] == "intake" and s["stages"][0]["status"] == "passed"
        assert (tmp_path / "data" / "kaudit.db").exists()
        below = descendants(p.pid)
        assert below, "the worker runs as a child process"
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
    time.sleep(1)
    assert not [pid for pid in below if _alive(pid)], "the worker outlived `kaudit serve`"


def _get(url: str) -> int:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return 0
