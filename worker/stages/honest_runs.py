"""What honest implementations output on given arguments: the yardstick the probes and the canary share.

No fp32 kernel reaches the correctly rounded result of a long reduction, and neither does the reference; so a kernel
is also judged against the reference run as honest implementations run it: at its own dtypes ('own') and with its
reductions summed in other honest orders (worker.numerics.reorder). Where the kernel's error is within its budget
of the largest of theirs, it is as good as an honest kernel can be.
"""

from __future__ import annotations

from typing import Any

import torch

from worker.context import AuditContext
from worker.numerics.placement import copy_to
from worker.numerics.reorder import STYLES


def _reference_at_own_precision(
    ctx: AuditContext, args: list[Any], reorder: str | None = None
) -> list[torch.Tensor] | None:
    """The reference at its own dtypes (`reorder`: with its reductions in another honest order), where the kernel
    runs; None where the reference fails on these arguments unpromoted (no yardstick then).

    A GPU's fp32 rounds (and so ties and selects) differently from the host's, and the kernel is held to the
    reference as it runs on the same device; on the CPU where the reference cannot run on the device (a factory
    without `device=`, or no memory left). An uploaded reference runs in its sandbox, on the CPU."""
    trusted = getattr(ctx.reference, "trusted", True)
    for device in dict.fromkeys([str(ctx.device) if trusted else "cpu", "cpu"]):
        copies = [copy_to(a, device) for a in args]
        try:
            with torch.no_grad():
                return [o.detach() for o in ctx.reference.run(copies, reorder=reorder)]
        except Exception:  # noqa: BLE001 - a reference that fails unpromoted here is no yardstick
            continue
    return None


def honest_runs(ctx: AuditContext, args: list[Any]) -> dict[str, list[torch.Tensor]]:
    """The reference at its own dtypes ('own') and re-run with its reductions split and sequential, each where it
    runs; each is measured against the fp64 oracle by the caller, and the largest error per group is what an honest
    kernel may make there."""
    runs: dict[str, list[torch.Tensor]] = {}
    for style in (None, *STYLES):
        outs = _reference_at_own_precision(ctx, args, style)
        if outs is not None:
            runs["own" if style is None else style] = outs
    return runs
