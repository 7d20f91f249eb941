"""The behavioural checks, on one moderate probe the kernel already answered: run it
twice, poison the outputs, compare the inputs the kernel left with the pristine copies,
and permute along the order-free axis (worker.numerics.checks)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from worker.context import AuditContext
from worker.inputs import Case
from worker.numerics import checks
from worker.probes.distributions import permute_case
from worker.problem_spec import AuditSpec, ProbeSpec
from worker.sandbox.protocol import CallReply
from worker.stages.probes.calls import KERNEL_FAILURES, call_kernel, positions
from worker.stages.probes.one_probe import Call, ProbeRuns
from worker.stages.probes.stage import NAME


@dataclass
class Behaviour:
    results: list[checks.CheckResult]
    evidence: dict[str, Any]
    seconds: float


def behavioural_checks(ctx: AuditContext, spec: AuditSpec, runs: ProbeRuns) -> Behaviour:
    """The checks on one probe, and the inputs-unmodified check over every call."""
    started = time.perf_counter()
    results: list[checks.CheckResult] = []
    evidence: dict[str, Any] = {}
    if runs.ran:
        chosen = _check_probe([p for p in spec.probes if p.name in runs.ran])
        ctx.progress(f"probes: behavioural checks on '{chosen.name}'")
        case, first = runs.ran[chosen.name]
        results, evidence = _run_checks(ctx, spec, chosen, case, first, runs.calls)
    if runs.calls:
        inputs = list(ctx.problem.definition.inputs)
        results.insert(0, checks.check_inputs_unmodified(inputs, runs.calls, ctx.device))
    return Behaviour(results, evidence, time.perf_counter() - started)


def _check_probe(probes: list[ProbeSpec]) -> ProbeSpec:
    """One moderate, realistic case for the behavioural checks."""
    return next((p for p in probes if not p.adversarial and not p.noncontiguous), probes[0])


def _run_checks(
    ctx: AuditContext,
    spec: AuditSpec,
    probe: ProbeSpec,
    case: Case,
    first: CallReply,
    calls: list[Call],
) -> tuple[list[checks.CheckResult], dict[str, Any]]:
    noncontig = positions(ctx, probe.noncontiguous)
    evidence: dict[str, Any] = {
        "probe": probe.name,
        "poison": [repr(checks.POISON_A), repr(checks.POISON_B)],
    }
    results = _rerun_checks(ctx, probe, case, first, noncontig, calls)
    permuted, evidence["permutation"] = _order_invariance(ctx, spec, probe, case, first, noncontig, calls)
    return results + permuted, evidence


def _rerun_checks(
    ctx: AuditContext,
    probe: ProbeSpec,
    case: Case,
    first: CallReply,
    noncontig: list[int],
    calls: list[Call],
) -> list[checks.CheckResult]:
    """Determinism and written outputs: the same inputs again, the outputs pre-filled
    with the other poison."""
    names = list(ctx.problem.definition.outputs)
    a, b = checks.POISON_A, checks.POISON_B
    try:
        second = call_kernel(ctx, case, b, noncontig)
        args = case.args(ctx.problem.definition)
        calls.append((f"{probe.name} (second run)", args, second.args_after))
        return [
            checks.check_determinism(names, first.outputs, second.outputs, a, b),
            checks.check_poison(names, first.outputs, second.outputs, a, b),
        ]
    except KERNEL_FAILURES as err:
        msg = (f"the kernel failed on a second run of the same inputs: {type(err).__name__}: {err}")[:600]
        return [checks.CheckResult(name="determinism", passed=False, summary=msg)]


def _order_invariance(
    ctx: AuditContext,
    spec: AuditSpec,
    probe: ProbeSpec,
    case: Case,
    first: CallReply,
    noncontig: list[int],
    calls: list[Call],
) -> tuple[list[checks.CheckResult], dict[str, Any] | str]:
    """The inputs permuted along the spec's order-free axis, where the inputs have it:
    the outputs may change only at rounding level. Returns the evidence as well."""
    definition = ctx.problem.definition
    axis = spec.order_free_axis
    indexed = axis is not None and any(axis in (s.shape or []) for s in definition.inputs.values())
    if axis is None or not indexed or axis not in case.axes:
        return (
            [],
            "skipped: the spec names no order_free_axis the inputs are indexed by",
        )
    perm_seed = ctx.derive_seed(NAME, "permutation")
    gen = torch.Generator().manual_seed(perm_seed)
    perm = torch.randperm(case.axes[axis], generator=gen)
    evidence = {"axis": axis, "seed": perm_seed}
    permuted = permute_case(definition, case, axis, perm)
    dims = {n: [i for i, a in enumerate(s.shape or []) if a == axis] for n, s in definition.outputs.items()}
    names = list(definition.outputs)
    try:
        third = call_kernel(ctx, permuted, checks.POISON_A, noncontig)
        label = f"{probe.name} (permuted along {axis})"
        calls.append((label, permuted.args(definition), third.args_after))
        outs = first.outputs, third.outputs
        return [checks.check_permutation(names, *outs, dims, perm, axis)], evidence
    except KERNEL_FAILURES as err:
        msg = (f"the kernel failed when the inputs were permuted along '{axis}': {type(err).__name__}: {err}")[:600]
        result = checks.CheckResult(name="order_invariance", passed=False, summary=msg)
        return [result], evidence
