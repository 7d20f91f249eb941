"""`kaudit serve --data-dir D` keeps everything under D: it wrote the filesystem broker's `control/` folder into the
current directory (kombu's default), wherever the data went."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from svc_support import example, free_port, wait_for

pytestmark = pytest.mark.slow


def test_kaudit_serve_writes_nothing_into_the_current_directory(tmp_path: Path) -> None:
    cwd, data = tmp_path / "elsewhere", tmp_path / "data"
    cwd.mkdir()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("KAUDIT_") and k not in ("DATABASE_URL", "REDIS_URL")
    }
    env["KAUDIT_CACHE_DIR"] = os.environ.get("KAUDIT_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "serve.out"
    with open(out, "wb") as fh:
        p = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "kaudit"),
                "serve",
                "--data-dir",
                str(data),
                "--port",
                str(free_port()),
                "--stages",
                "intake",
            ],
            cwd=cwd,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: "admin API key" in out.read_text() or p.poll() is not None, 120, "no key printed")
        text = out.read_text()
        key = re.search(r"(ka_[A-Za-z0-9_-]+)", text).group(1)  # type: ignore[union-attr]
        url = re.search(r"running at (http://\S+)", text).group(1)  # type: ignore[union-attr]
        h = {"Authorization": f"Bearer {key}"}
        sub = httpx.post(url + "/v1/submissions", json=example("pytorch_fp32"), headers=h, timeout=10)
        assert sub.status_code == 202, sub.text

        def finished() -> bool:  # an audit went through the broker both ways: every folder it uses exists by now
            return httpx.get(url + sub.json()["status_url"], headers=h, timeout=5).json()["status"] == "passed"

        wait_for(finished, 180, "the audit did not pass")
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=60)
    assert sorted(x.name for x in cwd.iterdir()) == []
    assert (data / "broker" / "control").is_dir() and (data / "kaudit.db").exists()
