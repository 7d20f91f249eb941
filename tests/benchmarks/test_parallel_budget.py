"""benchmarks.parallel.run_jobs: the time budget is for the jobs, not for setting the worker processes up."""

from __future__ import annotations

import os
import time
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
