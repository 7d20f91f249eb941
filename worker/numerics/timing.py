"""Timing primitives: one measuring loop, used by the trusted parent and the sandbox child alike.

On CUDA: warm-up, then `reps` calls each bracketed by CUDA events, with the L2 cache
flushed before each call; the host's time to issue each call is kept as well. On the
CPU: wall-clock per call. `fn(i)` is call number i (warm-up calls get -1 - k), `prepare(i)`
runs before it, outside the measured window (fresh poisoned outputs are made there).

What remains trusted when the child times a kernel (the benchmark stage, GPU): the numbers
come from the child's process, which the submission owns. The child uses copies of the CUDA
event functions taken before the submission was imported and reports any replaced timer,
checker or harness function ("tampered"), but a submission that rewrites that report too can
claim any time. What the parent checks itself: every timed call gets fresh inputs (none
repeats, so nothing can be memoised) and a fresh NaN-poisoned output, and a random sample of
the timed calls' outputs (chosen by the parent, unknown to the kernel unless it reads the
harness's memory) is judged against the reference; the claimed device times add up to no
more than the parent's own wall clock around each request; and the median call is no faster
than the bytes the op must touch over the card's peak memory bandwidth (worker.numerics.floor;
a breach is inconclusive, not a failure). So a forged time can only lie between that floor and
the truth. On the CPU the parent times each call itself (the round trip of one request, IPC
included), so the child's clock is not used at all.

The kernel and the reference are timed in interleaved blocks and the speedup carries a
bootstrap interval (worker.numerics.speedup); the blocks run inside the device's exclusive
timed window (worker.numerics.timed_window).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from pydantic import BaseModel, Field

L2_FLUSH_BYTES = 256 * 1024 * 1024


class TimingConfig(BaseModel):
    warmup: int = Field(ge=0)
    reps: int = Field(ge=1)
    flush_l2: bool = True


GPU_TIMING = TimingConfig(warmup=10, reps=100)
# the Triton interpreter is slow: a few wall-clock runs are all a CPU audit can afford
CPU_TIMING = TimingConfig(warmup=1, reps=3)

CLOCK_LABEL = {"cuda_events": "CUDA events", "wall_clock_cpu": "wall-clock (CPU)"}


def timing_config(device: str) -> TimingConfig:
    return GPU_TIMING if device.startswith("cuda") else CPU_TIMING


# a GPU call whose host-side issue time is at least this share of its device time is launch-bound
LAUNCH_BOUND_SHARE = 0.8


class TimingSample(BaseModel):
    times_ms: list[float]
    clock: str
    host_times_ms: list[float] | None = Field(None, description="GPU only: wall time the host spent issuing each call")

    @property
    def median_ms(self) -> float:
        return float(statistics.median(self.times_ms))

    @property
    def host_median_ms(self) -> float | None:
        return float(statistics.median(self.host_times_ms)) if self.host_times_ms else None

    @property
    def launch_bound(self) -> bool:
        host = self.host_median_ms
        return host is not None and host >= LAUNCH_BOUND_SHARE * self.median_ms


def measure(
    fn: Callable[[int], object],
    device: str | torch.device,
    cfg: TimingConfig,
    *,
    prepare: Callable[[int], object] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    event: Callable[..., Any] | None = None,
    elapsed: Callable[[Any, Any], float] | None = None,
) -> TimingSample:
    """Time `fn(i)` for i in range(reps) after `warmup` calls; `prepare(i)` runs before each, unmeasured.

    `clock`, `event` and `elapsed` default to this process's own (the child passes its pristine copies)."""
    dev = torch.device(device)
    before = prepare or (lambda i: None)
    for k in range(cfg.warmup):
        before(-1 - k)
        fn(-1 - k)
    if dev.type == "cuda":
        flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=dev)
        torch.cuda.synchronize(dev)
        make_event = event or torch.cuda.Event
        elapsed_ms = elapsed or torch.cuda.Event.elapsed_time
        starts = [make_event(enable_timing=True) for _ in range(cfg.reps)]
        ends = [make_event(enable_timing=True) for _ in range(cfg.reps)]
        host = []
        for i in range(cfg.reps):
            before(i)
            if cfg.flush_l2:
                flush.zero_()
            h0 = clock()
            starts[i].record()
            fn(i)
            ends[i].record()
            host.append((clock() - h0) * 1e3)
        torch.cuda.synchronize(dev)
        return TimingSample(
            times_ms=[float(elapsed_ms(s, e)) for s, e in zip(starts, ends)], clock="cuda_events", host_times_ms=host
        )
    times = []
    for i in range(cfg.reps):
        before(i)
        t0 = clock()
        fn(i)
        times.append((clock() - t0) * 1e3)
    return TimingSample(times_ms=times, clock="wall_clock_cpu")


def time_trusted(fn: Callable[[], object], device: str | torch.device, cfg: TimingConfig) -> TimingSample:
    """Time `fn` in this (trusted) process with the same loop as the child's op_time."""
    return measure(lambda _: fn(), device, cfg)


def device_name(device: str | torch.device) -> str:
    """The hardware a timing ran on, as the leaderboard's boards are split: 'cpu', or the GPU's name."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return "cpu"
    return str(torch.cuda.get_device_name(dev))
