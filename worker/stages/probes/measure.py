"""Each output's error against the oracle, per reduction group
(worker.numerics.error_metrics), and the inputs' statistics the report shows beside
it."""

from __future__ import annotations

import math
from typing import Any

import torch

from worker.context import AuditContext
from worker.inputs import Case
from worker.numerics.dtypes import to_torch
from worker.numerics.error_metrics import (
    INDEX_COUNT_EDGES,
    OutputError,
    index_count_labels,
    measure_output,
)
from worker.numerics.placement import on_device_or_cpu
from worker.problem_spec import AuditSpec, OutputBudget

Labels = tuple[torch.Tensor | None, tuple[tuple[int, int | None], ...], str | None]


def input_stats(case: Case, device: str) -> dict[str, Any]:
    """Each input's spread (floats, computed on the audit's device) or id counts
    (integers): evidence only."""
    stats: dict[str, Any] = {"scalars": {}}
    for name, v in case.inputs.items():
        if not isinstance(v, torch.Tensor):
            stats["scalars"][name] = v
        elif v.dtype.is_floating_point:
            stats[name] = on_device_or_cpu(device, lambda d, v=v: _spread(v.to(d, torch.float64)))
        elif v.numel() and v.dtype != torch.bool and int(v.min()) >= 0:
            counts = torch.bincount(v.reshape(-1).to(torch.int64))
            stats[name] = {
                "distinct": int((counts > 0).sum()),
                "hottest_count": int(counts.max()),
                "hottest_id": int(counts.argmax()),
            }
    return stats


def _spread(f: torch.Tensor) -> dict[str, float]:
    return {
        "std": float(f.std()) if f.numel() > 1 else 0.0,
        "absmax": float(f.abs().max()) if f.numel() else 0.0,
    }


def measure(
    ctx: AuditContext,
    spec: AuditSpec,
    case: Case,
    outs: list[torch.Tensor],
    ref: list[torch.Tensor],
    slack: float = 1.0,
    honest: dict[str, list[torch.Tensor]] | None = None,
) -> list[OutputError]:
    """Each output's error against the oracle, held to `slack` times its budget.

    Computed on the audit's GPU where there is one: it is the same fp64 arithmetic, and
    on the host it would add 5-15 s to a GPU audit's probes stage. On the CPU where the
    GPU has no memory left (worker.numerics.placement)."""
    return on_device_or_cpu(
        ctx.device,
        lambda device: _measure_on(device, ctx, spec, case, outs, ref, slack, honest),
    )


def _measure_on(
    device: torch.device,
    ctx: AuditContext,
    spec: AuditSpec,
    case: Case,
    outs: list[torch.Tensor],
    ref: list[torch.Tensor],
    slack: float,
    honest: dict[str, list[torch.Tensor]] | None,
) -> list[OutputError]:
    outs = [o.to(device) for o in outs]
    ref = [r.to(device) for r in ref]
    definition = ctx.problem.definition
    result = []
    # not strict: the reference's own outputs, measured as a yardstick
    # (oracle.own_precision_if_it_disagrees), are judged on as many outputs as they have
    paired = zip(definition.outputs.items(), outs, ref, strict=False)
    for i, ((name, out_spec), out, oracle) in enumerate(paired):
        budget = spec.budgets.get(name, OutputBudget())
        if slack != 1.0:
            budget = budget.model_copy(update={"max_ratio": budget.max_ratio * slack})
        labels, edges, kind = _labels(case, budget, out)
        labels = labels.to(device) if labels is not None else None
        yardstick = {run: run_outs[i].to(device) for run, run_outs in (honest or {}).items() if i < len(run_outs)}
        result.append(
            measure_output(
                name,
                out,
                oracle,
                to_torch(out_spec.dtype),
                budget,
                labels,
                edges,
                kind,
                honest=yardstick or None,
            )
        )
    return result


def _labels(case: Case, budget: OutputBudget, out: torch.Tensor) -> Labels:
    """Each reduction group's label for the budget's buckets (by the count of an index,
    or by the reduction's length), their edges, and the kind of bucket."""
    by = budget.bucket_by
    if by is None or out.dim() == 0:
        return None, INDEX_COUNT_EDGES, None
    dims = sorted({d % out.dim() for d in budget.group_dims})
    groups = math.prod(out.shape[d] for d in dims) if dims else 1
    if by.kind == "index_count":
        ids = case.inputs.get(by.input or "")
        if not isinstance(ids, torch.Tensor) or len(dims) != 1:
            return None, INDEX_COUNT_EDGES, None
        labels = index_count_labels(ids, groups)
        return labels, INDEX_COUNT_EDGES, f"index_count:{by.input}"
    length = case.axes.get(by.axis or "")
    if length is None:
        return None, INDEX_COUNT_EDGES, None
    labels = torch.full((groups,), length, dtype=torch.int64)
    return labels, ((length, length + 1),), f"reduction_length:{by.axis}"
