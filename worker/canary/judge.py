"""The canary's statistics and rule.

Rule (stated in every report):
  1. gradient fidelity: at every checked step of the reference run, the kernel's output for the
     op's real arguments, against fp64, normwise per bucket of rows (by contribution count), must
     stay within max_ratio x the error of the ideal output (fp64 rounded once to the output dtype) or, on the
     generic path, of the largest error honest implementations make on the same arguments (the reference at its own
     dtypes and with its reductions in other orders: an fp32 kernel that sums in another order cannot reach the
     ideal output either, and neither can the reference);
  2. loss: per optimiser, the paired gap G = mean over checkpoints of (held-out loss of the
     submission's weights - that of the reference's weights), same seed, init and batches, must not
     exceed max(band_factor x B, loss_floor), where B is the largest |G| of the null runs (the
     reference rerun, and the reference with its op output moved by one ulp on half the elements).
     One-sided: only a worse loss fails.
The canary fails when either part fails.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from pydantic import BaseModel

from worker.numerics.error_metrics import unit_roundoff
from worker.problem_spec import OutputBudget

COUNT_EDGES = (1, 2, 8, 64, 512, 4096)


class BucketFidelity(BaseModel):
    step: int
    output: str
    bucket: str
    rows: int
    context: int | None = None  # tokens of the window the op's arguments came from, where longer than training's
    kernel_rel_err: float
    ideal_rel_err: float
    honest_rel_err: float | None = None  # the largest honest implementation's, where they were run
    ratio: float  # the kernel's error over the larger of the ideal output's and the honest implementations'


def _bucket_label(lo: int, hi: int | None) -> str:
    if hi is None:
        return f">={lo}"
    return f"{lo}" if hi == lo + 1 else f"{lo}-{hi - 1}"


def _rel(a: torch.Tensor, exact: torch.Tensor) -> float:
    den = float(exact.norm())
    num = float((a - exact).norm())
    if not math.isfinite(num):
        return math.inf
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def fidelity(
    step: int,
    name: str,
    out: torch.Tensor,
    exact: torch.Tensor,
    budget: OutputBudget | None,
    counts: torch.Tensor | None,
    honest: list[torch.Tensor] | None = None,
) -> list[BucketFidelity]:
    """Normwise error per bucket of the kernel's output vs fp64, as a ratio to the larger of the ideal output's and
    the largest of the `honest` implementations' outputs' (each bucket on its own)."""
    dev = exact.device  # judged where the fp64 result is (the GPU when the audit has one)
    out_d = out.detach().to(dev).double()
    exact = exact.detach().double().reshape(out_d.shape)
    ideal = exact.to(out.dtype).double()
    # an integer output (expert ids) stays exact: an honest run that selects otherwise is no yardstick for it
    floating = out.dtype.is_floating_point
    yardsticks = [h.detach().to(dev).double().reshape(out_d.shape) for h in honest or []] if floating else []
    floor = unit_roundoff(out.dtype) / 8
    groups: list[tuple[str, torch.Tensor | None]] = []
    by_rows = budget is not None and budget.group_dims == [0] and counts is not None and out_d.dim() >= 1
    if by_rows:
        assert counts is not None
        c = counts.to(dev)
        edges = [*COUNT_EDGES, None]
        for lo, hi in itertools.pairwise(edges):
            assert lo is not None
            sel = (c >= lo) if hi is None else ((c >= lo) & (c < hi))
            if bool(sel.any()):
                groups.append((_bucket_label(lo, hi), sel))
    else:
        groups.append(("all", None))
    res = []
    for label, sel in groups:
        o, e, i = (out_d, exact, ideal) if sel is None else (out_d[sel], exact[sel], ideal[sel])
        k_err, i_err = _rel(o, e), _rel(i, e)
        # an honest run that overflows where fp64 does not is no yardstick either
        h_errs = [err for h in yardsticks if math.isfinite(err := _rel(h if sel is None else h[sel], e))]
        h_err = max(h_errs) if h_errs else None
        # 0 for an integer output (expert ids): exact, and so must the kernel's be
        den = max(i_err, h_err or 0.0, floor)
        ratio = (k_err / den if den > 0 else (0.0 if k_err == 0 else math.inf)) if math.isfinite(k_err) else math.inf
        res.append(
            BucketFidelity(
                step=step,
                output=name,
                bucket=label,
                rows=int(o.shape[0]) if o.dim() else 1,
                kernel_rel_err=k_err,
                ideal_rel_err=i_err,
                honest_rel_err=h_err,
                ratio=ratio,
            )
        )
    if by_rows:  # rows nothing points at must stay exactly zero
        assert counts is not None
        empty = counts.cpu() == 0
        if bool(empty.any()):
            stray = float(out_d[empty].abs().max()) if bool(empty.any()) else 0.0
            res.append(
                BucketFidelity(
                    step=step,
                    output=name,
                    bucket="0",
                    rows=int(empty.sum()),
                    kernel_rel_err=stray,
                    ideal_rel_err=0.0,
                    ratio=0.0 if stray == 0 else math.inf,
                )
            )
    return res


class LossJudgement(BaseModel):
    optimizer: str
    checkpoints: list[int]
    reference: list[float]
    submission: list[float]
    gap: list[float]
    mean_gap: float
    null_mean_gaps: list[float]
    null_gaps: list[list[float]]
    band: float
    threshold: float
    exceeded: bool


def _gaps(a: list[float], b: list[float]) -> list[float]:
    return [
        x - y if math.isfinite(x) and math.isfinite(y) else (math.inf if not math.isfinite(x) else -math.inf)
        for x, y in zip(a, b)
    ]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def judge_loss(
    optimizer: str,
    steps: list[int],
    reference: list[float],
    submission: list[float],
    nulls: list[list[float]],
    band_factor: float,
    loss_floor: float,
) -> LossJudgement:
    gap = _gaps(submission, reference)
    null_gaps = [_gaps(n, reference) for n in nulls]
    null_means = [_mean(g) for g in null_gaps]
    finite = [abs(m) for m in null_means if math.isfinite(m)]
    band = max(finite, default=0.0)
    threshold = max(band_factor * band, loss_floor)
    mean_gap = _mean(gap)
    return LossJudgement(
        optimizer=optimizer,
        checkpoints=steps,
        reference=reference,
        submission=submission,
        gap=gap,
        mean_gap=mean_gap,
        null_mean_gaps=null_means,
        null_gaps=null_gaps,
        band=band,
        threshold=threshold,
        exceeded=bool(mean_gap > threshold or math.isnan(mean_gap)),
    )


def worst(fid: list[BucketFidelity]) -> BucketFidelity | None:
    return max(fid, key=lambda f: f.ratio, default=None)


def summarise_fidelity(fid: list[BucketFidelity]) -> list[dict[str, Any]]:
    """Worst ratio per (output, bucket) over the checked steps."""
    best: dict[tuple[str, str], BucketFidelity] = {}
    for f in fid:
        key = (f.output, f.bucket)
        if key not in best or f.ratio > best[key].ratio:
            best[key] = f
    return [v.model_dump() for v in best.values()]
