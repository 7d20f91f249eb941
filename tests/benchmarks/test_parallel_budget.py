"""benchmarks.parallel.run_jobs: the time budget is for the jobs, not for setting the worker processes up."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from benchmarks.parallel import run_jobs

SETUP_S = 8.0
BUDGET_S = 5.0  # shorter than one worker's set-up: counted from the start, no job could finish in it


def _slow_setup(seconds: float) -> None:
    time.sleep(seconds)


def _job(i: int) -> dict[str, Any]:
    return {"i": i, "pid": os.getpid()}


def test_the_budget_counts_from_when_every_worker_is_set_up() -> None:
    results: list[dict[str, Any]] = []
    left = run_jobs(
        _job,
        [(i,) for i in range(4)],
        workers=2,
        budget_s=BUDGET_S,
        on_result=results.append,
        initializer=_slow_setup,
        initargs=(SETUP_S,),
    )
    assert left == 0
    assert sorted(r["i"] for r in results) == [0, 1, 2, 3]


def test_more_workers_than_jobs_and_no_jobs() -> None:
    results: list[dict[str, Any]] = []
    assert run_jobs(_job, [(7,)], workers=8, budget_s=60, on_result=results.append) == 0
    assert [r["i"] for r in results] == [7]
    assert run_jobs(_job, [], workers=2, budget_s=60, on_result=results.append) == 0


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 120  # a hang guard, not a margin: the file is written before anyone waits long
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.05)


def _job_or_die(i: int, folder: str) -> dict[str, Any]:
    """Job 0 kills its own process once job 1 is running beside it; job 1 runs until then (or at once, alone)."""
    d = Path(folder)
    if i == 0:
        _wait_for(d / "1.started")
        (d / "0.dying").write_text("")
        os.kill(os.getpid(), signal.SIGKILL)
    if i == 1:
        (d / "1.started").write_text("")
        _wait_for(d / "0.dying")
    return {"i": i, "pid": os.getpid()}


def test_a_job_that_kills_its_process_is_reported_and_the_others_finish(tmp_path: Path) -> None:
    results: list[dict[str, Any]] = []
    died: list[tuple[tuple[Any, ...], str]] = []
    left = run_jobs(
        _job_or_die,
        [(i, str(tmp_path)) for i in range(4)],
        workers=2,
        budget_s=float("inf"),
        on_result=results.append,
        on_died=lambda job, why: died.append((job, why)),
        tasks_per_process=1,
    )
    assert left == 1
    # job 1 was in flight when the pool broke: it ran again, alone, and finished once
    assert sorted(r["i"] for r in results) == [1, 2, 3]
    assert [job[0] for job, _ in died] == [0]
    assert "died" in died[0][1]
