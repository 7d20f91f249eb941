"""What a probe is judged against: the oracle, and what honest implementations achieve.

The oracle computes in fp64 on the audit's device where it can
(worker.numerics.placement, worker.generic.promote). For a definition without oracle.py
the reference is also run as honest implementations would run it, at its own dtypes and
with its reductions in other orders (worker.numerics.reorder); where the definition's
result depends on precision, the reference at its own precision becomes the oracle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from worker.context import AuditContext
from worker.generic.promote import GenericOracle
from worker.inputs import Case
from worker.numerics.placement import copy_to, on_device_or_cpu
from worker.problem_spec import AuditSpec
from worker.stages.honest_runs import honest_runs
from worker.stages.probes.measure import measure

# where the generic oracle could not be promoted and is the reference at its own
# precision, the budget is this many times wider: the "ideal" error is then measured
# against a result that is itself rounded
REFERENCE_ORACLE_SLACK = 4.0


def oracle_outputs(oracle: Callable[..., Any], case: Case, ctx: AuditContext) -> list[torch.Tensor]:
    """The oracle's outputs (fp64 where floating), left where they were made.

    A curated oracle.py computes on its inputs' device: the audit's GPU, or the CPU
    where the GPU has no memory left (worker.numerics.placement). Its fp64 arithmetic
    differs between the two only in the order of additions, some 1e-16 relative, far
    below the rounding of any output dtype it judges. The generic oracle places itself
    (worker.generic.promote.GenericOracle): on the GPU where that cannot change its
    result, on the CPU once the reference selects by order, since CUDA's top-k breaks
    ties differently from the CPU's."""
    definition = ctx.problem.definition
    args = case.args(definition)
    with torch.no_grad():
        if isinstance(oracle, GenericOracle):
            result = oracle(*[_clone(a) for a in args])
        else:
            result = on_device_or_cpu(ctx.device, lambda d: oracle(*[copy_to(a, d) for a in args]))
    outs = list(result) if isinstance(result, (tuple, list)) else [result]
    if len(outs) != len(definition.outputs):
        raise ValueError(f"the oracle returned {len(outs)} outputs for {len(definition.outputs)} in the definition")
    return [_detached_fp64(o) for o in outs]


def _clone(a: Any) -> Any:
    return a.clone() if isinstance(a, torch.Tensor) else a


def _detached_fp64(o: torch.Tensor) -> torch.Tensor:
    return o.detach().to(torch.float64) if o.dtype.is_floating_point else o.detach()


def slack(oracle: Callable[..., Any]) -> float:
    """How many times its budget a probe may use: wider where the generic oracle's last
    run fell back to the reference's own precision."""
    if isinstance(oracle, GenericOracle) and not oracle.last_promoted:
        return REFERENCE_ORACLE_SLACK
    return 1.0


def reference_runs(ctx: AuditContext, case: Case) -> dict[str, list[torch.Tensor]]:
    """Honest implementations' outputs on `case` (worker.stages.honest_runs): the reference at its own dtypes
    ('own') and re-run with its reductions split and sequential (worker.numerics.reorder).

    Each is measured against the fp64 oracle, and the largest error per group is what an
    honest kernel may make there (worker.numerics.error_metrics)."""
    return honest_runs(ctx, case.args(ctx.problem.definition))


def own_precision_if_it_disagrees(
    ctx: AuditContext,
    spec: AuditSpec,
    case: Case,
    promoted: list[torch.Tensor],
    runs: dict[str, list[torch.Tensor]],
) -> tuple[list[torch.Tensor], str] | None:
    """The reference at its own precision, where it fails its own budget against the
    promoted result, even judged against the other honest orderings of its reductions.

    Then the definition's semantics depend on precision (top-k ties, thresholds,
    selections decided differently in fp64): no kernel is held to a stricter standard
    than the reference, so the reference itself is the oracle for this probe, with a
    wider budget.
    """
    own = runs.get("own")
    if own is None:
        return None
    others = {k: v for k, v in runs.items() if k != "own"} or None
    try:
        errors = measure(ctx, spec, case, own, promoted, honest=others)
    except Exception:  # noqa: BLE001 - outputs the measure cannot take (wrong shapes): no oracle either
        return None
    if all(e.passed for e in errors):
        return None
    worst = max(errors, key=lambda e: (not e.passed, e.mismatches or 0, e.worst_ratio))
    what = f"{worst.mismatches} integer mismatches" if worst.mismatches else f"{worst.worst_ratio:.3g}x the ideal error"
    note = (
        f"the reference at its own precision is off the fp64-promoted result here "
        f"({what} on '{worst.output}'): its result depends on precision (ties, "
        f"thresholds, selections), so this probe is judged against the reference "
        f"itself with a {REFERENCE_ORACLE_SLACK:g}x wider budget"
    )
    return [o.to(torch.float64) if o.dtype.is_floating_point else o for o in own], note
