"""`kaudit serve` binds its port before it prints anything: what it prints is reachable, and a taken port is one
clear line with exit 2 (it printed the banner, then crashed with Errno 98)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from svc_support import free_port, wait_for
from typer.testing import CliRunner

from app.cli import app

KAUDIT = Path(sys.executable).parent / "kaudit"


def _env() -> dict[str, str]:
    return {
        k: v for k, v in os.environ.items() if not k.startswith("KAUDIT_") and k not in ("DATABASE_URL", "REDIS_URL")
    }


def test_taken_port_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = CliRunner().invoke(app, ["serve", "--data-dir", str(tmp_path / "data"), "--port", str(port)])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), (r.exception, r.stdout, r.stderr)
    assert "running at" not in r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "in use" in lines[0], r.stderr
    assert not (tmp_path / "data").exists()  # it stopped before touching anything


def test_bad_stages_is_exit_2(tmp_path: Path) -> None:
    r = CliRunner().invoke(
        app, ["serve", "--data-dir", str(tmp_path / "data"), "--port", str(free_port()), "--stages", "speed"]
    )
    assert r.exit_code == 2 and "unknown stage" in r.stderr and not (tmp_path / "data").exists()


@pytest.mark.slow
def test_the_printed_url_is_already_listening(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "serve.out"
    with open(out, "wb") as fh:
        p = subprocess.Popen(
            [str(KAUDIT), "serve", "--data-dir", str(tmp_path / "data"), "--port", str(port), "--stages", "intake"],
            cwd=tmp_path,
            env=_env(),
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: "running at" in out.read_text() or p.poll() is not None, 90, "no banner")
        assert p.poll() is None, out.read_text()
        # the moment the banner is out, the port accepts connections (on main the bind came after the print)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
