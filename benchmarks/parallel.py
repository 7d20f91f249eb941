"""Running benchmark audits N at once, each in its own process, under a time budget."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
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
    on_died: Callable[[Job, str], None] | None = None,
) -> int:
    """Call fn(*job) for every job, `workers` at a time, each in a spawned process (CUDA cannot fork).

    Results reach `on_result` as they finish. Past `budget_s` seconds the running jobs are stopped
    and the rest never start; returns how many jobs did not finish. `initializer(*initargs)` runs once in
    each worker process before its first job (a warm worker's set-up). The budget counts from when every
    worker process has been set up: eight warm workers starting at once on one GPU took 50 s, which had cut
    a 110 s budget to 55 s of audits (benchmarks/results/h200-2026-12-03/session10). `tasks_per_process`: a
    process is replaced after that many jobs, so nothing one job leaves on the device (the caching allocator's
    blocks) is there for the next (the set-up job counts as one).

    A worker process that dies (the host's out-of-memory killer, a crash in native code) breaks the whole pool:
    every job in flight or waiting fails with it, and the pool cannot say whose process died. So the jobs that were
    running then are suspects: the others go on in a new pool, within the same budget, and each suspect runs again
    afterwards alone; one whose process dies alone is reported to `on_died`, with why, and not run again. One job
    that kills its process cannot take the run down (on an H200 one did: benchmarks/results/h200-2026-12-07).
    """
    done = 0
    pending = list(range(len(jobs)))
    suspects: list[int] = []
    idle_breaks = 0
    deadline: float | None = None
    with multiprocessing.get_context("spawn").Manager() as manager:
        started = manager.dict()  # job index -> pid of the process that took it, for the batch in flight
        while pending or suspects:
            alone = not pending
            batch = [suspects[0]] if alone else pending
            pool = _ready_pool(
                manager, 1 if alone else max(1, min(workers, len(batch))), initializer, initargs, tasks_per_process
            )
            if deadline is None:
                deadline = time.monotonic() + budget_s
            started.clear()  # who takes a job of this batch, so a break names only this batch's running jobs
            futures = {pool.submit(_call, fn, i, started, jobs[i]): i for i in batch}
            finished: set[int] = set()
            broken = stopped = False
            try:
                left = deadline - time.monotonic()
                for fut in as_completed(futures, timeout=None if budget_s == float("inf") else max(0.0, left)):
                    try:
                        result = fut.result()
                    except BrokenProcessPool:
                        broken = True
                        break
                    finished.add(futures[fut])
                    on_result(result)
                    done += 1
            except TimeoutError:
                for fut in futures:
                    fut.cancel()
                stop_workers(pool)
                stopped = True
            finally:
                pool.shutdown(wait=not stopped, cancel_futures=True)
            for fut, i in futures.items():  # results that came in beside the break are kept, not run again
                if broken and i not in finished and fut.done() and not fut.cancelled() and fut.exception() is None:
                    finished.add(i)
                    on_result(fut.result())
                    done += 1
            running = [i for i in batch if i in started and i not in finished] if broken else []
            if alone:
                if broken and on_died is not None:
                    on_died(
                        jobs[batch[0]],
                        "its process died while it ran alone (killed by a signal, the host's out-of-memory killer "
                        "or a crash in native code); not run again",
                    )
                suspects = suspects[1:]  # finished, died, or cut by the budget (the loop ends below)
            else:
                if broken:
                    print(f"a worker process died; running then, to run again alone: {running}", flush=True)
                    idle_breaks = 0 if running else idle_breaks + 1
                    if idle_breaks > 1:  # a process that dies with no job in it (its set-up): no new pool will do
                        raise RuntimeError("worker processes die before they take a job; see the initializer")
                suspects += running
                pending = [i for i in pending if i not in finished and i not in running] if broken else []
            if stopped or time.monotonic() >= deadline:
                if done < len(jobs):
                    print(f"time budget of {budget_s:.0f} s reached; {len(jobs) - done} audits unfinished", flush=True)
                break
    return len(jobs) - done


def _ready_pool(
    manager: Any,
    workers: int,
    initializer: Callable[..., None] | None,
    initargs: tuple[Any, ...],
    tasks_per_process: int | None,
) -> ProcessPoolExecutor:
    """A pool whose `workers` processes are all set up (one ready job each, waiting for the others)."""
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=(initializer, initargs),
        max_tasks_per_child=tasks_per_process,
    )
    barrier = manager.Barrier(workers)
    for ready in [pool.submit(_ready, barrier) for _ in range(workers)]:
        ready.result()
    return pool


def _call(fn: Callable[..., dict[str, Any]], index: int, started: Any, job: Job) -> dict[str, Any]:
    started[index] = os.getpid()  # the parent's record of who was running when a process died
    return fn(*job)


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
