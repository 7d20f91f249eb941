"""How much slower this machine is right now than the one the CPU canary's time limit was set on.

The CPU canary trains for tens of seconds; on a loaded or slower host a correct kernel's training can run past a
fixed limit, and the audit would end inconclusive for the auditor's own reasons. The limit is instead scaled by a
short, fixed fp32 workload timed just before the canary, on one thread (the submission's child trains on one):
its time over the same workload's time on the reference host is the slowdown. Never below 1: a faster host keeps
the stated limit, which bounds a hanging kernel."""

from __future__ import annotations

import time

import torch

# the workload's best time on the reference host (2 cores, 1 thread, idle): bench with `python -m worker.canary.speed`
REFERENCE_S = 0.0043
MAX_SLOWDOWN = 8.0
_N, _REPS = 192, 12


def _workload_s() -> float:
    a = torch.randn(_N, _N, generator=torch.Generator().manual_seed(0))
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        b = a
        for _ in range(_REPS):
            b = torch.tanh(b @ a) * 0.5
        best = min(best, time.perf_counter() - t)
    return best


def slowdown() -> float:
    """This host's slowdown against the reference host, in [1, MAX_SLOWDOWN], measured now on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        measured = _workload_s()
    finally:
        torch.set_num_threads(threads)
    return min(MAX_SLOWDOWN, max(1.0, measured / REFERENCE_S))


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(f"workload best of 3: {_workload_s():.5f} s (REFERENCE_S = {REFERENCE_S}); slowdown now: {slowdown():.2f}")
