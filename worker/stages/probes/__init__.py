"""Stage 4, probes: the op on the distributions real workloads produce and on
adversarial ones.

Per probe (audit.json `probes`, or, for a definition without audit.json, probes derived
from the definition by worker.generic with axes drawn from the audit's seed): build the
inputs in the trusted process, call the kernel in its sandbox, run the fp64 oracle on
the same (already rounded) inputs, and judge the error per reduction group against the
ideal output's (worker.numerics.error_metrics). Then, on one moderate case: run twice,
poison the outputs, compare the inputs the kernel left with the pristine copies, and
permute along the order-free axis (worker.numerics.checks).

The modules, in the order the stage uses them: plan (curated spec or derived plan),
one_probe (each probe: inputs, oracle, kernel call, measure), calls (the sandbox call),
oracle (the oracle and the honest reference runs), measure (errors per group), checks
(the behavioural checks), report (status, summary, metrics, evidence).
"""

from __future__ import annotations

from worker.context import AuditContext
from worker.stages.probes.checks import behavioural_checks
from worker.stages.probes.one_probe import run_probes
from worker.stages.probes.plan import jittered as _jittered
from worker.stages.probes.plan import spec_and_plan as _spec
from worker.stages.probes.report import inconclusive_under_interpreter, nothing_applies, report
from worker.stages.probes.stage import NAME
from worker.stages.result import StageResult, StageStatus

# _spec and _jittered: the tests call them through the stage
__all__ = ["NAME", "_jittered", "_spec", "run"]


def run(ctx: AuditContext) -> StageResult:
    spec, plan = _spec(ctx)
    if not spec.probes:
        summary = f"{ctx.problem.name}: audit.json lists no probes"
        return StageResult(name=NAME, status=StageStatus.skipped, summary=summary)
    # a curated probe's var axes are drawn for this audit; a derived plan drew its own
    runs = run_probes(ctx, spec, jitter=plan is None and spec.jitter_axes)
    if not runs.applicable:
        return nothing_applies(ctx, plan, runs)
    behaviour = behavioural_checks(ctx, spec, runs)
    result = report(ctx, spec, plan, runs, behaviour)
    bf16_op = next((r.interpreter_bf16 for _, r in runs.ran.values() if r.interpreter_bf16), None)
    if result.status == StageStatus.failed and bf16_op is not None:
        return inconclusive_under_interpreter(result, bf16_op)
    return result
