"""A Celery pool process is given time to start: it imports torch and the engine before it reports up, and Celery's
own 4 s limit killed replacement after replacement under load. The limit comes from
KAUDIT_WORKER_PROC_ALIVE_TIMEOUT_S, and a real worker whose pool processes take longer than 4 s to start still
recovers from a SIGKILLed pool process and runs the next queued audit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from svc_support import ROOT, bootstrap, example, kill_tree, start_api, start_worker, wait_for
from test_crash import _pool_processes

from app.core.settings import Settings
from app.jobs.celery import make_celery

CELERY_DEFAULT_S = 4.0
KILLED_AT_START = "Timed out waiting for UP message"  # what Celery logs as it SIGKILLs a pool process still starting
# longer than Celery's default, as a pool process's start-up is on a loaded host (13-18 s were seen)
SLOW_START_S = 8.0
# a pool process's start-up made slow the way a loaded host makes it slow: its first import of the engine waits.
# Only pool processes import worker.engine (the Celery parent never does), so the parent starts at its usual pace
SLOW_ENGINE_IMPORT = f"""
import importlib.abc, sys, time


class _SlowEngineImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "worker.engine":
            time.sleep({SLOW_START_S})
        return None


sys.meta_path.insert(0, _SlowEngineImport())
"""


def test_the_alive_timeout_setting_reaches_the_worker_app() -> None:
    assert Settings().worker_proc_alive_timeout_s == 120.0
    assert make_celery(Settings()).conf.worker_proc_alive_timeout == 120.0
    # the worker entry point (`celery -A app.jobs.worker`) reads it from the environment
    env = {**os.environ, "KAUDIT_WORKER_PROC_ALIVE_TIMEOUT_S": "77.5"}
    out = subprocess.run(
        [sys.executable, "-c", "from app.jobs.worker import app; print(app.conf.worker_proc_alive_timeout)"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip().splitlines()[-1] == "77.5", out.stderr[-2000:]


def _finished(url: str, key: str, sid: str) -> bool:
    s = httpx.get(f"{url}/v1/submissions/{sid}", headers={"Authorization": f"Bearer {key}"}, timeout=5).json()
    return s["status"] not in ("queued", "running")


@pytest.mark.services
@pytest.mark.slow
def test_a_sigkilled_pool_process_is_replaced_and_the_next_audit_runs(
    service_settings: Settings, tmp_path: Path
) -> None:
    assert service_settings.worker_proc_alive_timeout_s > SLOW_START_S > CELERY_DEFAULT_S
    keys = bootstrap(service_settings)
    h = {"Authorization": f"Bearer {keys['alice']}"}
    hook = tmp_path / "slow_start"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SLOW_ENGINE_IMPORT)
    pythonpath = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
    api, url = start_api(service_settings, tmp_path / "api.log")
    worker = start_worker(service_settings, tmp_path / "w.log", "slowstart", PYTHONPATH=pythonpath)
    try:
        first = httpx.post(f"{url}/v1/submissions", json=example("pytorch_fp32"), headers=h, timeout=10).json()["id"]
        wait_for(lambda: _finished(url, keys["alice"], first), 300, "the first audit did not finish", worker)
        [pool] = _pool_processes(worker.p.pid)
        os.kill(pool, signal.SIGKILL)
        wait_for(
            lambda: (p := _pool_processes(worker.p.pid)) and p != [pool],
            60,
            "the pool process was not replaced",
            worker,
        )
        queued = httpx.post(f"{url}/v1/submissions", json=example("pytorch_fp32"), headers=h, timeout=10).json()["id"]
        # Celery checks the alive timeout on replacements only (not on the pool's first processes): with its 4 s
        # default it kills this one mid-start, and every one after it, and the audit never runs
        wait_for(
            lambda: _finished(url, keys["alice"], queued) or KILLED_AT_START in worker.tail(1_000_000),
            300,
            "the audit queued after the kill did not finish",
            worker,
        )
        assert KILLED_AT_START not in worker.tail(1_000_000), worker.tail()
        # it was run by the replacement (its verdict is the audit's business: a loaded host can make intake inconclusive)
        status = httpx.get(f"{url}/v1/submissions/{queued}", headers=h, timeout=5).json()
        assert status["stages"] and status["finished_at"] is not None, status
    finally:
        kill_tree(worker)
        api.kill()
