"""Stage 4, probes: the op on the distributions real workloads produce and on adversarial ones.

Per probe (audit.json `probes`, or, for a definition without audit.json, probes derived from the
definition by worker.generic with axes drawn from the audit's seed): build the inputs in the trusted process, call the kernel
in its sandbox, run the fp64 oracle on the same (already rounded) inputs, and judge the
error per reduction group against the ideal output's (worker.numerics.error_metrics). Then, on one
moderate case: run twice, poison the outputs, compare the inputs the kernel left with the
pristine copies, and permute along the order-free axis (worker.numerics.checks).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from worker.context import AuditContext
from worker.generic.promote import GenericOracle
from worker.generic.shapes import jittered_keeping_divisibility
from worker.generic.spec import GenericPlan, derive_plan
from worker.inputs import Case
from worker.numerics import checks
from worker.numerics.dtypes import to_torch
from worker.numerics.error_metrics import (
    INDEX_COUNT_EDGES,
    OutputError,
    floor_note,
    index_count_labels,
    measure_output,
)
from worker.numerics.placement import on_device_or_cpu
from worker.numerics.reorder import STYLES
from worker.probes.diagnosis import diagnose
from worker.probes.distributions import (
    ProbeInputError,
    ProbeSources,
    build_probe_case,
    permute_case,
)
from worker.probes.outcome import ProbeOutcome
from worker.problem_spec import AuditSpec, OutputBudget, ProbeSpec
from worker.sandbox import SandboxCrash, SandboxTimeout, SubmissionError
from worker.stages.result import StageResult, StageStatus

NAME = "probes"
_KERNEL_FAILURES = (SubmissionError, SandboxCrash, SandboxTimeout)
# where the generic oracle could not be promoted and is the reference at its own precision, the budget
# is this many times wider: the "ideal" error is then measured against a result that is itself rounded
REFERENCE_ORACLE_SLACK = 4.0


class KernelOutputError(RuntimeError):
    """The kernel handed back outputs of the wrong number, shape or dtype."""


def _positions(ctx: AuditContext, names: list[str]) -> list[int]:
    order = list(ctx.problem.definition.inputs)
    return [order.index(n) for n in names]


def _call(ctx: AuditContext, case: Case, poison: float, noncontiguous: list[int]) -> dict[str, Any]:
    definition = ctx.problem.definition
    reply = ctx.sandbox().request(
        "call",
        {
            "args": case.args(definition),
            "outputs": case.output_specs(definition),
            "poison": poison,
            "noncontiguous": noncontiguous,
            "digest_after": True,  # the inputs after the call come back as digests (checks.check_inputs_unmodified)
        },
    )
    outs = reply["outputs"]
    if len(outs) != len(definition.outputs):
        raise KernelOutputError(f"the kernel returned {len(outs)} outputs; the definition has {len(definition.outputs)}")
    for (name, spec), t in zip(definition.outputs.items(), outs):
        want_shape, want_dtype = case.output_shapes[name], to_torch(spec.dtype)
        if tuple(t.shape) != tuple(want_shape) or t.dtype != want_dtype:
            raise KernelOutputError(
                f"output '{name}' is {tuple(t.shape)} {t.dtype}; the definition says {tuple(want_shape)} {want_dtype}"
            )
    return reply


def _oracle(oracle: Callable[..., Any], case: Case, ctx: AuditContext) -> list[torch.Tensor]:
    """The oracle's outputs (fp64 where floating), left where they were made.

    A curated oracle.py computes on its inputs' device: the audit's GPU, or the CPU where the GPU has no memory
    left (worker.numerics.placement). Its fp64 arithmetic differs between the two only in the order of additions,
    some 1e-16 relative, far below the rounding of any output dtype it judges. The generic oracle places itself
    (worker.generic.promote.GenericOracle): on the GPU where that cannot change its result; measured on the H200
    (2026-12-02), CUDA's top-k breaks ties differently from the CPU's."""
    args = case.args(ctx.problem.definition)
    with torch.no_grad():
        if isinstance(oracle, GenericOracle):
            result = oracle(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
        else:
            result = on_device_or_cpu(
                ctx.device, lambda d: oracle(*[a.to(d, copy=True) if isinstance(a, torch.Tensor) else a for a in args])
            )
    outs = list(result) if isinstance(result, (tuple, list)) else [result]
    if len(outs) != len(ctx.problem.definition.outputs):
        raise ValueError(f"the oracle returned {len(outs)} outputs for {len(ctx.problem.definition.outputs)} in the definition")
    return [o.detach().to(torch.float64) if o.dtype.is_floating_point else o.detach() for o in outs]


def _labels(ctx: AuditContext, case: Case, budget: OutputBudget, out: torch.Tensor) -> tuple[torch.Tensor | None, tuple[tuple[int, int | None], ...], str | None]:
    by = budget.bucket_by
    if by is None or out.dim() == 0:
        return None, INDEX_COUNT_EDGES, None
    dims = sorted({d % out.dim() for d in budget.group_dims})
    groups = math.prod(out.shape[d] for d in dims) if dims else 1
    if by.kind == "index_count":
        ids = case.inputs.get(by.input or "")
        if not isinstance(ids, torch.Tensor) or len(dims) != 1:
            return None, INDEX_COUNT_EDGES, None
        return index_count_labels(ids, groups), INDEX_COUNT_EDGES, f"index_count:{by.input}"
    length = case.axes.get(by.axis or "")
    if length is None:
        return None, INDEX_COUNT_EDGES, None
    return torch.full((groups,), length, dtype=torch.int64), ((length, length + 1),), f"reduction_length:{by.axis}"


def _spread(f: torch.Tensor) -> dict[str, float]:
    return {"std": float(f.std()) if f.numel() > 1 else 0.0, "absmax": float(f.abs().max()) if f.numel() else 0.0}


def _input_stats(case: Case, device: str) -> dict[str, Any]:
    """Each input's spread (floats, computed on the audit's device) or id counts (integers): evidence only."""
    stats: dict[str, Any] = {"scalars": {}}
    for name, v in case.inputs.items():
        if not isinstance(v, torch.Tensor):
            stats["scalars"][name] = v
        elif v.dtype.is_floating_point:
            stats[name] = on_device_or_cpu(device, lambda d, v=v: _spread(v.to(d, torch.float64)))
        elif v.numel() and v.dtype != torch.bool and int(v.min()) >= 0:
            counts = torch.bincount(v.reshape(-1).to(torch.int64))
            stats[name] = {"distinct": int((counts > 0).sum()), "hottest_count": int(counts.max()), "hottest_id": int(counts.argmax())}
    return stats


def _measure(ctx: AuditContext, spec_: AuditSpec, case: Case, outs: list[torch.Tensor], ref: list[torch.Tensor],
             slack: float = 1.0, honest: dict[str, list[torch.Tensor]] | None = None) -> list[OutputError]:
    """Each output's error against the oracle, computed on the audit's GPU where there is one (the same fp64
    arithmetic; on the host it cost 5-15 s of a GPU audit's probes stage, H200 profile of 2026-12-02), on the CPU
    where the GPU has no memory left (worker.numerics.placement)."""
    return on_device_or_cpu(ctx.device, lambda device: _measure_on(device, ctx, spec_, case, outs, ref, slack, honest))


def _measure_on(
    device: torch.device, ctx: AuditContext, spec_: AuditSpec, case: Case, outs: list[torch.Tensor], ref: list[torch.Tensor],
    slack: float, honest: dict[str, list[torch.Tensor]] | None = None,
) -> list[OutputError]:
    outs = [o.to(device) for o in outs]
    ref = [r.to(device) for r in ref]
    definition, budgets = ctx.problem.definition, spec_.budgets
    result = []
    for i, ((name, spec), out, oracle) in enumerate(zip(definition.outputs.items(), outs, ref)):
        budget = budgets.get(name, OutputBudget())
        if slack != 1.0:
            budget = budget.model_copy(update={"max_ratio": budget.max_ratio * slack})
        labels, edges, kind = _labels(ctx, case, budget, out)
        labels = labels.to(device) if labels is not None else None
        yardstick = {run: outputs[i].to(device) for run, outputs in (honest or {}).items() if i < len(outputs)}
        result.append(measure_output(name, out, oracle, to_torch(spec.dtype), budget, labels, edges, kind,
                                     honest=yardstick or None))
    return result


def _slack(oracle: Callable[..., Any]) -> float:
    if isinstance(oracle, GenericOracle) and oracle.runs and oracle.runs[-1].precision == "reference":
        return REFERENCE_ORACLE_SLACK
    return 1.0


@contextmanager
def _timed(outcome: ProbeOutcome, phase: str, device: str) -> Iterator[None]:
    """Adds the phase's wall time to outcome.timings, the GPU's queued work included (a sync at the end)."""
    t = time.perf_counter()
    try:
        yield
    finally:
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
        outcome.timings[phase] = outcome.timings.get(phase, 0.0) + time.perf_counter() - t


def _jittered(ctx: AuditContext, probe: ProbeSpec) -> ProbeSpec:
    """A curated probe at var axes drawn for this audit (worker.generic.shapes.jittered_keeping_divisibility)."""
    definition = ctx.problem.definition
    stated = probe.axes_for(ctx.profile)
    var_axes = {a: v for a, v in stated.items() if a in definition.var_axes}
    gen = torch.Generator().manual_seed(ctx.derive_seed(NAME, "axes", probe.name))
    drawn = {**stated, **jittered_keeping_divisibility(definition, var_axes, gen)}
    return probe.model_copy(update={"axes": drawn, "gpu_axes": drawn})


def _run_probe(
    ctx: AuditContext, spec: AuditSpec, probe: ProbeSpec, oracle: Callable[..., Any], sources: ProbeSources,
    notes: list[str], jitter: bool = False,
) -> tuple[ProbeOutcome, Case | None, dict[str, Any] | None]:
    seed = ctx.derive_seed(NAME, probe.name)
    outcome = ProbeOutcome(
        name=probe.name,
        why=probe.why,
        adversarial=probe.adversarial,
        seed=seed,
        spec=probe.model_dump(exclude_none=True),
        noncontiguous=probe.noncontiguous,
    )
    try:
        with _timed(outcome, "inputs", ctx.device):
            drawn = _jittered(ctx, probe) if jitter else probe
            case = build_probe_case(ctx.problem.definition, drawn, ctx.profile, seed, sources, notes, device=ctx.device)
            outcome.axes = case.axes
            outcome.input_stats = _input_stats(case, ctx.device)
    except ProbeInputError as err:
        outcome.input_error = str(err)
        return outcome, None, None
    generic = isinstance(oracle, GenericOracle)
    ref: list[torch.Tensor] | None = None
    honest: dict[str, list[torch.Tensor]] | None = None
    slack = _slack(oracle)
    if generic:  # a derived probe the definition's own reference rejects does not apply; it is no kernel failure
        try:
            with _timed(outcome, "oracle", ctx.device):
                ref = _oracle(oracle, case, ctx)
        except Exception as err:  # noqa: BLE001 - the reference's own error on these inputs
            outcome.not_applicable = f"the reference rejects these inputs: {type(err).__name__}: {err}"[:400]
            return outcome, None, None
        slack = _slack(oracle)
        with _timed(outcome, "honest", ctx.device):
            runs = _reference_runs(ctx, case)
            own = _own_precision_if_it_disagrees(ctx, spec, case, ref, runs)
        if own is not None:
            ref, note = own
            outcome.oracle_note = note
            slack = REFERENCE_ORACLE_SLACK
        elif slack == 1.0:  # judged against what honest implementations achieve, not only the ideal output
            honest = runs
    try:
        with _timed(outcome, "kernel", ctx.device):
            reply = _call(ctx, case, checks.POISON_A, _positions(ctx, probe.noncontiguous))
    except (*_KERNEL_FAILURES, KernelOutputError) as err:
        outcome.kernel_error = f"{type(err).__name__}: {err}"[:600]
        return outcome, case, None
    if ref is None:
        with _timed(outcome, "oracle", ctx.device):
            ref = _oracle(oracle, case, ctx)
    with _timed(outcome, "measure", ctx.device):
        outcome.outputs = _measure(ctx, spec, case, reply["outputs"], ref, slack, honest)
    return outcome, case, reply


def _reference_at_own_precision(ctx: AuditContext, case: Case, reorder: str | None = None) -> list[torch.Tensor] | None:
    """The reference at its own dtypes (`reorder`: with its reductions in another honest order), where the kernel runs.

    A GPU's fp32 rounds (and so ties and selects) differently from the host's, and the kernel is held to the reference
    as it runs on the same device; on the CPU where the reference cannot run on the device (a factory without
    `device=`, or no memory left). An uploaded reference runs in its sandbox, on the CPU."""
    for device in dict.fromkeys([str(ctx.device) if getattr(ctx.reference, "trusted", True) else "cpu", "cpu"]):
        args = [a.to(device, copy=True) if isinstance(a, torch.Tensor) else a for a in case.args(ctx.problem.definition)]
        try:
            with torch.no_grad():
                return [o.detach() for o in ctx.reference.run(args, reorder=reorder)]
        except Exception:  # noqa: BLE001 - a reference that fails unpromoted here cannot serve as a yardstick
            continue
    return None


def _reference_runs(ctx: AuditContext, case: Case) -> dict[str, list[torch.Tensor]]:
    """Honest implementations' outputs on `case`: the reference at its own dtypes ('own') and re-run with its
    reductions split and sequential (worker.numerics.reorder). Each is measured against the fp64 oracle, and the
    largest error per group is what an honest kernel may make there (worker.numerics.error_metrics)."""
    runs: dict[str, list[torch.Tensor]] = {}
    for style in (None, *STYLES):
        outs = _reference_at_own_precision(ctx, case, style)
        if outs is not None:
            runs["own" if style is None else style] = outs
    return runs


def _own_precision_if_it_disagrees(
    ctx: AuditContext, spec: AuditSpec, case: Case, promoted: list[torch.Tensor], runs: dict[str, list[torch.Tensor]]
) -> tuple[list[torch.Tensor], str] | None:
    """The reference at its own precision, where it fails its own budget against the promoted result, even judged
    against the other honest orderings of its reductions.

    Then the definition's semantics depend on precision (top-k ties, thresholds, selections decided
    differently in fp64): no kernel is held to a stricter standard than the reference, so the reference
    itself is the oracle for this probe, with a wider budget.
    """
    own = runs.get("own")
    if own is None:
        return None
    try:
        errors = _measure(ctx, spec, case, own, promoted, honest={k: v for k, v in runs.items() if k != "own"} or None)
    except Exception:  # noqa: BLE001 - outputs the measure cannot take (wrong shapes): no oracle either
        return None
    if all(e.passed for e in errors):
        return None
    worst = max(errors, key=lambda e: (not e.passed, e.mismatches or 0, e.worst_ratio))
    what = f"{worst.mismatches} integer mismatches" if worst.mismatches else f"{worst.worst_ratio:.3g}x the ideal error"
    note = (f"the reference at its own precision is off the fp64-promoted result here ({what} on '{worst.output}'): its "
            f"result depends on precision (ties, thresholds, selections), so this probe is judged against the reference "
            f"itself with a {REFERENCE_ORACLE_SLACK:g}x wider budget")
    return [o.to(torch.float64) if o.dtype.is_floating_point else o for o in own], note


def _check_probe(probes: list[ProbeSpec]) -> ProbeSpec:
    """One moderate, realistic case for the behavioural checks."""
    return next((p for p in probes if not p.adversarial and not p.noncontiguous), probes[0])


def _run_checks(
    ctx: AuditContext, spec: AuditSpec, probe: ProbeSpec, case: Case, first: dict[str, Any],
    calls: list[tuple[str, list[Any], list[Any]]],
) -> tuple[list[checks.CheckResult], dict[str, Any]]:
    definition = ctx.problem.definition
    names = list(definition.outputs)
    noncontig = _positions(ctx, probe.noncontiguous)
    results: list[checks.CheckResult] = []
    evidence: dict[str, Any] = {"probe": probe.name, "poison": [repr(checks.POISON_A), repr(checks.POISON_B)]}
    try:
        second = _call(ctx, case, checks.POISON_B, noncontig)
        calls.append((f"{probe.name} (second run)", case.args(definition), second["args_after"]))
        results.append(checks.check_determinism(names, first["outputs"], second["outputs"], checks.POISON_A, checks.POISON_B))
        results.append(checks.check_poison(names, first["outputs"], second["outputs"], checks.POISON_A, checks.POISON_B))
    except (*_KERNEL_FAILURES, KernelOutputError) as err:
        msg = f"the kernel failed on a second run of the same inputs: {type(err).__name__}: {err}"[:600]
        results.append(checks.CheckResult(name="determinism", passed=False, summary=msg))
    axis = spec.order_free_axis
    has_axis = axis is not None and any(axis in (s.shape or []) for s in definition.inputs.values())
    if axis is not None and has_axis and axis in case.axes:
        perm_seed = ctx.derive_seed(NAME, "permutation")
        perm = torch.randperm(case.axes[axis], generator=torch.Generator().manual_seed(perm_seed))
        evidence["permutation"] = {"axis": axis, "seed": perm_seed}
        permuted = permute_case(definition, case, axis, perm)
        dims = {n: [i for i, a in enumerate(s.shape or []) if a == axis] for n, s in definition.outputs.items()}
        try:
            third = _call(ctx, permuted, checks.POISON_A, noncontig)
            calls.append((f"{probe.name} (permuted along {axis})", permuted.args(definition), third["args_after"]))
            results.append(checks.check_permutation(names, first["outputs"], third["outputs"], dims, perm, axis))
        except (*_KERNEL_FAILURES, KernelOutputError) as err:
            msg = f"the kernel failed when the inputs were permuted along '{axis}': {type(err).__name__}: {err}"[:600]
            results.append(checks.CheckResult(name="order_invariance", passed=False, summary=msg))
    else:
        evidence["permutation"] = "skipped: the spec names no order_free_axis the inputs are indexed by"
    return results, evidence


def _spec(ctx: AuditContext) -> tuple[AuditSpec, GenericPlan | None]:
    """audit.json where the problem has one; otherwise probes derived from the definition for this audit."""
    problem = ctx.problem
    if problem.curated:
        return problem.spec, None
    plan = derive_plan(problem.definition, problem.workloads(ctx.profile), ctx.profile, ctx.derive_seed(NAME, "plan"),
                       ctx.reference)
    return plan.spec, plan


def run(ctx: AuditContext) -> StageResult:
    problem = ctx.problem
    definition = problem.definition
    spec, plan = _spec(ctx)
    if not spec.probes:
        return StageResult(name=NAME, status=StageStatus.skipped, summary=f"{problem.name}: audit.json lists no probes")
    oracle = problem.oracle(ctx.reference, device=ctx.device)
    sources = ProbeSources(reference=ctx.reference, workloads=problem.workloads(ctx.profile), token_stats=problem.token_stats)
    notes: list[str] = []
    outcomes: list[ProbeOutcome] = []
    calls: list[tuple[str, list[Any], list[Any]]] = []
    ran: dict[str, tuple[Case, dict[str, Any]]] = {}
    for probe in spec.probes:
        ctx.progress(f"probes: {probe.name}")
        outcome, case, reply = _run_probe(ctx, spec, probe, oracle, sources, notes, jitter=plan is None and spec.jitter_axes)
        outcomes.append(outcome)
        if case is not None and reply is not None:
            calls.append((probe.name, case.args(definition), reply["args_after"]))
            ran[probe.name] = (case, reply)
    applicable = [o for o in outcomes if o.not_applicable is None]
    if not applicable:
        return StageResult(
            name=NAME, status=StageStatus.skipped,
            summary=f"{problem.name}: no derived probe applies (the reference rejects every probe's inputs)",
            evidence={"not_applicable": {o.name: o.not_applicable for o in outcomes},
                      **({"generic": plan.report()} if plan is not None else {})},
        )
    behaviour: list[checks.CheckResult] = []
    check_evidence: dict[str, Any] = {}
    checks_started = time.perf_counter()
    if ran:
        chosen = _check_probe([p for p in spec.probes if p.name in ran])
        ctx.progress(f"probes: behavioural checks on '{chosen.name}'")
        behaviour, check_evidence = _run_checks(ctx, spec, chosen, *ran[chosen.name], calls)
    if calls:
        behaviour.insert(0, checks.check_inputs_unmodified(list(definition.inputs), calls, ctx.device))
    checks_s = time.perf_counter() - checks_started

    failed_probes = [o for o in applicable if o.kernel_error or (o.input_error is None and not o.passed)]
    input_errors = [o for o in applicable if o.input_error]
    failed_checks = [c for c in behaviour if not c.passed]
    diagnosis = diagnose(applicable, behaviour)
    measured = [o for o in outcomes if o.outputs]
    worst = max(measured, key=lambda o: o.worst_ratio) if measured else None

    if failed_probes or failed_checks:
        status = StageStatus.failed
        parts = []
        if failed_probes:
            names = ", ".join(o.name for o in failed_probes[:4]) + ("..." if len(failed_probes) > 4 else "")
            parts.append(f"{len(failed_probes)} of {len(applicable)} probes over their error budget or failing ({names})")
        if failed_checks:
            parts.append("failed checks: " + ", ".join(c.name for c in failed_checks))
        if worst is not None and worst.worst_ratio > 0:
            parts.append(f"worst error {worst.worst_ratio:.1f}x the ideal output's on '{worst.name}'")
        summary = "; ".join(parts)
    elif input_errors:
        status = StageStatus.error
        summary = f"{'audit.json' if plan is None else 'derived'} probes could not be built: {input_errors[0].input_error}"
    else:
        status = StageStatus.passed
        budget = max((out.max_ratio for o in measured for out in o.outputs), default=0.0)
        summary = (
            f"{len(applicable)} probes within budget (worst {worst.worst_ratio:.2f}x the ideal output's error on "
            f"'{worst.name}', budget {budget:g}x); " if worst else f"{len(applicable)} probes ran; "
        ) + ", ".join(c.name for c in behaviour) + " checks passed"

    metrics: dict[str, Any] = {
        "probes": {o.name: o.metrics() for o in outcomes},
        "checks": {c.name: {"passed": c.passed, "summary": c.summary, **c.details} for c in behaviour},
        "worst_ratio": round(worst.worst_ratio, 3) if worst else None,
        "worst_probe": worst.name if worst else None,
        "diagnosis": diagnosis,
        "timings": {
            **{f"{phase}_s": round(sum(o.timings.get(phase, 0.0) for o in outcomes), 3)
               for phase in ("inputs", "oracle", "honest", "kernel", "measure")},
            "checks_s": round(checks_s, 3),
        },
    }
    dtypes = {to_torch(s.dtype) for s in definition.outputs.values() if to_torch(s.dtype).is_floating_point}
    evidence: dict[str, Any] = {
        "profile": ctx.profile,
        "device": ctx.device,
        "oracle": (
            oracle.summary() if isinstance(oracle, GenericOracle)
            else f"{spec.oracle} (fp64, CPU, fed the same rounded inputs)"
        ),
        "spec": "audit.json (curated)" if plan is None else "derived from the definition (no audit.json)",
        "judged": (
            "normwise error per reduction group vs the fp64 oracle, divided by the error of the oracle rounded once to "
            "the output dtype" + ("" if plan is None else ", or, where larger, by the largest error of an honest "
                                  "implementation in that group: the reference at its own dtypes, and with its sums "
                                  "and matrix products split and sequential (worker.numerics.reorder)")
        ),
        "floor": [floor_note(d) for d in sorted(dtypes, key=str)],
        "seeds": {o.name: o.seed for o in outcomes},
        "probes": [{**o.spec, "axes_used": o.axes, "seed": o.seed} for o in outcomes],
        "axes_drawn": (
            "each probe's var axes drawn within +-25% of the stated ones from the audit seed "
            "(derive_seed('probes', 'axes', probe)), keeping the power of two that divides each"
            if plan is None and spec.jitter_axes else
            "derived probes: axes drawn from the plan seed" if plan is not None else "as stated (jitter_axes: false)"
        ),
        "not_applicable": {o.name: o.not_applicable for o in outcomes if o.not_applicable},
        "budgets": {n: b.model_dump() for n, b in spec.budgets.items()},
        "checks": check_evidence,
    }
    if plan is not None:
        evidence["generic"] = {**plan.report(), "plan_seed": ctx.derive_seed(NAME, "plan")}
        summary = "generic probes (no audit.json): " + summary
    if problem.token_stats is not None:
        evidence["token_stats"] = {**problem.token_stats.describe(), "notes": notes[:20]}
    return StageResult(name=NAME, status=status, summary=summary, metrics=metrics, evidence=evidence)
