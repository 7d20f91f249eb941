"""A worker proves at start that submissions will be isolated, and refuses to start when they would not be,
unless the operator opts out explicitly (KAUDIT_ISOLATION=none), which every report then shows."""

from __future__ import annotations

from pathlib import Path

import pytest
from svc_support import bootstrap, start_worker, wait_for

from app.core.settings import Settings

pytestmark = [pytest.mark.services, pytest.mark.slow]


def test_a_worker_that_cannot_isolate_refuses_to_start(service_settings: Settings, tmp_path: Path) -> None:
    bootstrap(service_settings)
    # no bubblewrap on this PATH: the isolation check fails, as on a host without it
    worker = start_worker(service_settings, tmp_path / "w.log", PATH=str(tmp_path / "empty-bin"))
    try:
        code = wait_for(lambda: worker.p.poll(), 300, "the worker did not refuse to start", worker)
        assert code == 78, worker.tail()
        assert "refusing to start" in worker.tail() and "KAUDIT_ISOLATION=none" in worker.tail()
        assert "ready." not in worker.tail()
    finally:
        worker.kill()


def test_the_operator_can_opt_out_and_the_worker_says_so(service_settings: Settings, tmp_path: Path) -> None:
    settings = service_settings.model_copy(update={"isolation": "none"})
    bootstrap(settings)
    worker = start_worker(settings, tmp_path / "w.log", PATH=str(tmp_path / "empty-bin"))
    try:
        wait_for(lambda: "ready." in worker.tail(), 300, "the opted-out worker did not start", worker)
        assert "UNISOLATED" in worker.tail() and worker.p.poll() is None
    finally:
        worker.kill()
