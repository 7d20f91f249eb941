"""The stage's result: its status and summary, the metrics per probe and check, and the
evidence that makes each probe reproducible."""

from __future__ import annotations

from typing import Any

from worker.context import AuditContext
from worker.generic.promote import GenericOracle
from worker.generic.spec import GenericPlan
from worker.numerics import checks
from worker.numerics.dtypes import to_torch
from worker.numerics.error_metrics import floor_note
from worker.probes.diagnosis import diagnose
from worker.probes.literal_constants import constant_mismatch
from worker.probes.outcome import ProbeOutcome
from worker.problem_spec import AuditSpec
from worker.report import WORKER_LIMIT
from worker.sandbox import interpreter_bf16
from worker.stages.probes.checks import Behaviour
from worker.stages.probes.one_probe import ProbeRuns
from worker.stages.probes.stage import NAME
from worker.stages.result import StageResult, StageStatus

_PHASES = ("inputs", "oracle", "honest", "kernel", "measure")


def nothing_applies(ctx: AuditContext, plan: GenericPlan | None, runs: ProbeRuns) -> StageResult:
    """Skipped: the definition's own reference rejects every derived probe's inputs."""
    return StageResult(
        name=NAME,
        status=StageStatus.skipped,
        summary=(f"{ctx.problem.name}: no derived probe applies (the reference rejects every probe's inputs)"),
        evidence={
            "not_applicable": {o.name: o.not_applicable for o in runs.outcomes},
            **({"generic": plan.report()} if plan is not None else {}),
        },
    )


def inconclusive_under_interpreter(result: StageResult, op: str) -> StageResult:
    """A failure of a Triton kernel that did bf16 arithmetic under the CPU interpreter, which computes bf16 on the
    raw bits (worker.sandbox.interpreter_bf16): the numbers say nothing about the kernel, so the stage is an error
    (inconclusive on this worker), with what it measured kept as evidence."""
    summary = f"{interpreter_bf16.inconclusive(op)} (measured here: {result.summary})"
    evidence = {**result.evidence, "interpreter_bf16": op, WORKER_LIMIT: interpreter_bf16.LIMIT}
    return result.model_copy(update={"status": StageStatus.error, "summary": summary, "evidence": evidence})


def report(
    ctx: AuditContext,
    spec: AuditSpec,
    plan: GenericPlan | None,
    runs: ProbeRuns,
    behaviour: Behaviour,
) -> StageResult:
    applicable = runs.applicable
    binding = [o for o in applicable if not o.advisory]
    notes = [o for o in applicable if o.advisory and o.input_error is None and not o.passed]
    measured = [o for o in runs.outcomes if o.outputs and not o.advisory]
    worst = max(measured, key=lambda o: o.worst_ratio) if measured else None
    diagnosis = diagnose(applicable, behaviour.results)
    status, summary = _verdict(binding, behaviour.results, measured, worst, plan)
    if status is StageStatus.failed:
        failing = [o.name for o in binding if o.kernel_error is None and o.input_error is None and not o.passed]
        sources = [f.content for f in ctx.solution.sources]
        constant = constant_mismatch(ctx.problem.definition.reference, sources, failing) if failing else None
        if constant is not None:  # a named cause ahead of the error's size: what the author changes
            diagnosis.insert(0, constant)
    if notes:
        summary += "; advisory, not counted: " + ", ".join(
            f"{o.name} ({'raised' if o.kernel_error else 'wrong'}: the kernel assumes contiguous inputs; call it on "
            "contiguous tensors or make its wrapper call .contiguous())"
            if o.noncontiguous
            else o.name
            for o in notes
        )
    metrics = _metrics(runs.outcomes, behaviour, worst, diagnosis)
    metrics["advisories"] = [o.name for o in notes]
    layout = [o for o in notes if o.noncontiguous]
    if layout:
        # a finding of its own, not a numerics failure: wrong only on views the benchmark's contract never hands over
        metrics["layout"] = {
            "status": "warning",
            "finding": "wrong on strided views of its inputs",
            "probes": [o.name for o in layout],
            "inputs": sorted({n for o in layout for n in o.noncontiguous}),
            "kernel_error": next((o.kernel_error for o in layout if o.kernel_error), None),
        }
    evidence = _evidence(ctx, spec, plan, runs, behaviour.evidence)
    if plan is not None:
        plan_seed = ctx.derive_seed(NAME, "plan")
        evidence["generic"] = {**plan.report(), "plan_seed": plan_seed}
        summary = "generic probes (no audit.json): " + summary
    token_stats = ctx.problem.token_stats
    if token_stats is not None:
        evidence["token_stats"] = {**token_stats.describe(), "notes": runs.notes[:20]}
    return StageResult(name=NAME, status=status, summary=summary, metrics=metrics, evidence=evidence)


def _verdict(
    applicable: list[ProbeOutcome],
    behaviour: list[checks.CheckResult],
    measured: list[ProbeOutcome],
    worst: ProbeOutcome | None,
    plan: GenericPlan | None,
) -> tuple[StageStatus, str]:
    """Failed where a probe or a check failed; an error where probes could not be built
    (a fault of the spec, not of the kernel); passed otherwise."""
    failed_probes = [o for o in applicable if o.kernel_error or (o.input_error is None and not o.passed)]
    failed_checks = [c for c in behaviour if not c.passed]
    if failed_probes or failed_checks:
        summary = _failure_summary(len(applicable), failed_probes, failed_checks, worst)
        return StageStatus.failed, summary
    input_errors = [o for o in applicable if o.input_error]
    if input_errors:
        source = "audit.json" if plan is None else "derived"
        error = input_errors[0].input_error
        return StageStatus.error, f"{source} probes could not be built: {error}"
    return StageStatus.passed, _pass_summary(len(applicable), behaviour, measured, worst)


def _failure_summary(
    applicable: int,
    failed_probes: list[ProbeOutcome],
    failed_checks: list[checks.CheckResult],
    worst: ProbeOutcome | None,
) -> str:
    parts = []
    if failed_probes:
        names = ", ".join(o.name for o in failed_probes[:4])
        names += "..." if len(failed_probes) > 4 else ""
        parts.append(f"{len(failed_probes)} of {applicable} probes over their error budget or failing ({names})")
    if failed_checks:
        parts.append("failed checks: " + ", ".join(c.name for c in failed_checks))
    if worst is not None and worst.worst_ratio > 0:
        parts.append(f"worst error {worst.worst_ratio:.1f}x the ideal output's on '{worst.name}'")
    return "; ".join(parts)


def _pass_summary(
    applicable: int,
    behaviour: list[checks.CheckResult],
    measured: list[ProbeOutcome],
    worst: ProbeOutcome | None,
) -> str:
    if worst is None:
        head = f"{applicable} probes ran; "
    else:
        budget = max((out.max_ratio for o in measured for out in o.outputs), default=0.0)
        head = (
            f"{applicable} probes within budget (worst {worst.worst_ratio:.2f}x the "
            f"ideal output's error on '{worst.name}', budget {budget:g}x); "
        )
    return head + ", ".join(c.name for c in behaviour) + " checks passed"


def _metrics(
    outcomes: list[ProbeOutcome],
    behaviour: Behaviour,
    worst: ProbeOutcome | None,
    diagnosis: Any,
) -> dict[str, Any]:
    phase_seconds = {f"{phase}_s": round(sum(o.timings.get(phase, 0.0) for o in outcomes), 3) for phase in _PHASES}
    return {
        "probes": {o.name: o.metrics() for o in outcomes},
        "checks": {c.name: {"passed": c.passed, "summary": c.summary, **c.details} for c in behaviour.results},
        "worst_ratio": round(worst.worst_ratio, 3) if worst else None,
        "worst_probe": worst.name if worst else None,
        "diagnosis": diagnosis,
        "timings": {**phase_seconds, "checks_s": round(behaviour.seconds, 3)},
    }


def _evidence(
    ctx: AuditContext,
    spec: AuditSpec,
    plan: GenericPlan | None,
    runs: ProbeRuns,
    check_evidence: dict[str, Any],
) -> dict[str, Any]:
    """What reproduces each probe (seeds, axes used, budgets) and how it was judged."""
    outputs = ctx.problem.definition.outputs.values()
    dtypes = {to_torch(s.dtype) for s in outputs if to_torch(s.dtype).is_floating_point}
    outcomes = runs.outcomes
    return {
        "profile": ctx.profile,
        "device": ctx.device,
        "oracle": _oracle_description(spec, runs),
        "spec": ("audit.json (curated)" if plan is None else "derived from the definition (no audit.json)"),
        "judged": _judged(plan),
        "floor": [floor_note(d) for d in sorted(dtypes, key=str)],
        "seeds": {o.name: o.seed for o in outcomes},
        "probes": [{**o.spec, "axes_used": o.axes, "seed": o.seed} for o in outcomes],
        "axes_drawn": _axes_drawn(spec, plan),
        "not_applicable": {o.name: o.not_applicable for o in outcomes if o.not_applicable},
        "budgets": {n: b.model_dump() for n, b in spec.budgets.items()},
        "checks": check_evidence,
    }


def _oracle_description(spec: AuditSpec, runs: ProbeRuns) -> str:
    if isinstance(runs.oracle, GenericOracle):
        return runs.oracle.summary()
    # a curated oracle.py computes where its inputs are (oracle.oracle_outputs)
    return (
        f"{spec.oracle} (fp64 on the audit's device, or the CPU where the GPU has no "
        "memory left; fed the same rounded inputs)"
    )


def _judged(plan: GenericPlan | None) -> str:
    judged = (
        "normwise error per reduction group vs the fp64 oracle, divided by the error "
        "of the oracle rounded once to the output dtype"
    )
    if plan is None:
        return judged
    return judged + (
        ", or, where larger, by the largest error of an honest implementation in that "
        "group: the reference at its own dtypes, and with its sums and matrix products "
        "split and sequential (worker.numerics.reorder)"
    )


def _axes_drawn(spec: AuditSpec, plan: GenericPlan | None) -> str:
    if plan is not None:
        return "derived probes: axes drawn from the plan seed"
    if spec.jitter_axes:
        return (
            "each probe's var axes drawn within +-25% of the stated ones from the "
            "audit seed (derive_seed('probes', 'axes', probe)), keeping the power of "
            "two that divides each"
        )
    return "as stated (jitter_axes: false)"
