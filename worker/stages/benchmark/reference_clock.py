"""The reference timed in this process, block by block, so that the submission cannot forge the other half of
its speedup; each block is measured the way the kernel's is on that device, so the two are comparable."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import torch

from worker.context import AuditContext
from worker.numerics.timing import TimingConfig, TimingSample, time_trusted
from worker.stages.benchmark.timed import ReferenceBlock
from worker.stages.benchmark.workloads import to_device


def time_reference(ctx: AuditContext, args: list[Any], cfg: TimingConfig) -> ReferenceBlock | None:
    """The reference timed as the kernel is, one block at a time: on the GPU with CUDA events here; on the CPU as a
    round trip (the same serialisation in process, or, for an uploaded reference, its own sandbox's real round
    trip). An uploaded reference cannot be timed with events on the GPU: None."""
    fn = ctx.reference.run_fn
    gpu = ctx.device.startswith("cuda")

    def timer(call: Callable[[], object]) -> ReferenceBlock:
        def block(warmup: int, reps: int) -> TimingSample:
            with torch.no_grad():
                return time_trusted(call, ctx.device, TimingConfig(warmup=warmup, reps=reps, flush_l2=cfg.flush_l2))

        return block

    if not ctx.problem.reference_trusted:
        return None if gpu else timer(lambda: fn(*args))  # its sandbox's round trip, like the kernel's
    dev_args = to_device(args, ctx.device)
    return timer((lambda: fn(*dev_args)) if gpu else (lambda: _with_transport(fn, dev_args)))


def _with_transport(fn: Any, args: list[Any]) -> object:
    """`fn(*args)` with its arguments and results serialised and read back as a sandbox request and reply are
    (our own data: read without the weights-only guard the parent keeps for the child's replies)."""

    def through(obj: object) -> Any:
        buf = io.BytesIO()
        torch.save(obj, buf)
        buf.seek(0)
        return torch.load(buf, weights_only=False)

    out = fn(*through(args))
    return through(list(out) if isinstance(out, (tuple, list)) else [out])
