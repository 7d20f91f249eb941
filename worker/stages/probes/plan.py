"""What to probe: audit.json's curated probes, or probes derived from the definition.

A curated probe's var axes are drawn for each audit (unless audit.json sets jitter_axes:
false), so that no kernel can be exact only on known shapes; a derived plan draws its
axes from the plan seed.
"""

from __future__ import annotations

import torch

from worker.context import AuditContext
from worker.generic.shapes import jittered_keeping_divisibility
from worker.generic.spec import GenericPlan, derive_plan
from worker.problem_spec import AuditSpec, ProbeSpec
from worker.stages.probes.stage import NAME


def spec_and_plan(ctx: AuditContext) -> tuple[AuditSpec, GenericPlan | None]:
    """audit.json where the problem has one; otherwise probes derived from the
    definition for this audit (and the plan they came from)."""
    problem = ctx.problem
    if problem.curated:
        return problem.spec, None
    plan = derive_plan(
        problem.definition,
        problem.workloads(ctx.profile),
        ctx.profile,
        ctx.derive_seed(NAME, "plan"),
        ctx.reference,
    )
    return plan.spec, plan


def jittered(ctx: AuditContext, probe: ProbeSpec) -> ProbeSpec:
    """A curated probe at var axes drawn for this audit
    (worker.generic.shapes.jittered_keeping_divisibility)."""
    definition = ctx.problem.definition
    stated = probe.axes_for(ctx.profile)
    var_axes = {a: v for a, v in stated.items() if a in definition.var_axes}
    gen = torch.Generator().manual_seed(ctx.derive_seed(NAME, "axes", probe.name))
    drawn = {**stated, **jittered_keeping_divisibility(definition, var_axes, gen)}
    return probe.model_copy(update={"axes": drawn, "gpu_axes": drawn})
