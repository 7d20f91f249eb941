"""Which workload is timed, the tolerance each workload is judged by, and the reference's outputs.

The correctness rounds and the timed passes both need these, and the benchmark scripts under benchmarks/ pick
the timed workload the same way the stage does, so they live apart from either."""

from __future__ import annotations

import math
from typing import Any

import torch

from worker.catalogue import Problem, Profile
from worker.context import AuditContext
from worker.formats import Workload
from worker.problem_spec import Tolerance


def to_device(args: list[Any], device: str | torch.device) -> list[Any]:
    return [a.to(device).clone() if isinstance(a, torch.Tensor) else a for a in args]


def timing_workload(problem: Problem, profile: Profile) -> Workload:
    """spec.timing_workload when it names one of this profile's workloads, else the largest by elements."""
    workloads = problem.workloads(profile)
    named = problem.spec.timing_workload
    if named:
        for w in workloads:
            if w.uuid == named:
                return w
    definition = problem.definition

    def size(w: Workload) -> int:
        axes = definition.resolve_axes(w.axes)
        specs = [*definition.inputs.values(), *definition.outputs.values()]
        return sum(math.prod(definition.shape_of(s, axes)) for s in specs if not s.is_scalar)

    return max(workloads, key=size)


def tolerance_for(problem: Problem, workload: Workload) -> Tolerance:
    base = problem.spec.tolerance.model_dump()
    override = {k: v for k, v in (workload.tolerance or {}).items() if k in base}
    return Tolerance(**{**base, **override})


def reference_outputs(ctx: AuditContext, args: list[Any]) -> list[torch.Tensor]:
    with torch.no_grad():
        return ctx.reference.run(to_device(args, ctx.device))
