"""Running benchmark audits N at once, each in its own process, under a time budget."""

from __future__ import annotations

import multiprocessing
import signal
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

Job = tuple[Any, ...]


def run_jobs(
    fn: Callable[..., dict[str, Any]],
    jobs: Sequence[Job],
    *,
    workers: int,
    budget_s: float,
    on_result: Callable[[dict[str, Any]], None],
    initializer: Callable[..., None] | None = None,
    initargs: tuple[Any, ...] = (),
    tasks_per_process: int | None = None,
) -> int:
    """Call fn(*job) for every job, `workers` at a time, each in a spawned process (CUDA cannot fork).

    Results reach `on_result` as they finish. Past `budget_s` seconds the running jobs are stopped
    and the rest never start; returns how many jobs did not finish. `initializer(*initargs)` runs once in
    each worker process before its first job (a warm worker's set-up). The budget counts from when every
    worker process has been set up: eight warm workers starting at once on one GPU took 50 s, which had cut
    a 110 s budget to 55 s of audits (benchmarks/results/h200-2026-12-03/session10). `tasks_per_process`: a
    process is replaced after that many jobs, so nothing one job leaves on the device (the caching allocator's
    blocks) is there for the next (the set-up job counts as one).
    """
    done, stopped = 0, False
    workers = max(1, min(workers, len(jobs)))
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=(initializer, initargs),
        max_tasks_per_child=tasks_per_process,
    )
    with multiprocessing.get_context("spawn").Manager() as manager:
        barrier = manager.Barrier(workers)  # one ready job per process: each waits until all are set up
        for ready in [pool.submit(_ready, barrier) for _ in range(workers)]:
            ready.result()
    futures = [pool.submit(fn, *job) for job in jobs]
    try:
        for fut in as_completed(futures, timeout=None if budget_s == float("inf") else budget_s):
            on_result(fut.result())
            done += 1
    except TimeoutError:
        print(f"time budget of {budget_s:.0f} s reached; {len(jobs) - done} audits unfinished", flush=True)
        for fut in futures:
            fut.cancel()
        stop_workers(pool)
        stopped = True
    finally:
        pool.shutdown(wait=not stopped, cancel_futures=True)
    return len(jobs) - done


def _ready(barrier: Any) -> None:
    barrier.wait()


def _init_worker(initializer: Callable[..., None] | None, initargs: tuple[Any, ...]) -> None:
    # SIGTERM unwinds the running audit, whose cleanup kills its sandbox child
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if initializer is not None:
        initializer(*initargs)


def stop_workers(pool: ProcessPoolExecutor, grace_s: float = 5.0) -> None:
    """Stop a pool's running audits: SIGTERM (each unwinds and kills its sandbox child), then SIGKILL."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    for proc in procs:
        proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
