"""A worker process warms its side of the canary once, in the background, and its next audit waits for it."""

from __future__ import annotations

from app.core.settings import Settings
from app.jobs.resources import WorkerResources
from worker.canary.binding import SITES


def test_the_warm_up_runs_once_and_waiting_returns_when_it_is_done(sqlite_settings: Settings) -> None:
    res = WorkerResources(sqlite_settings)
    res.wait_parent_warm(timeout_s=0)  # nothing started: returns at once
    res.start_parent_warm("cpu")
    started = res.parent_warm_done
    assert started is not None
    res.start_parent_warm("cpu")  # a second call starts nothing
    assert res.parent_warm_done is started
    res.wait_parent_warm(timeout_s=600)
    assert started.is_set()
    assert set(res.parent_warm_s) == set(SITES)  # every canary site the catalogue can match


def test_a_failed_warm_up_still_releases_the_audits(sqlite_settings: Settings) -> None:
    res = WorkerResources(sqlite_settings)
    res.start_parent_warm("no-such-device")
    res.wait_parent_warm(timeout_s=600)
    assert res.parent_warm_done is not None and res.parent_warm_done.is_set()
    assert res.parent_warm_s == {}
