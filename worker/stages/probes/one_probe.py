"""Running the probes: per probe, build the inputs in the trusted process, find what the
outputs are judged against, call the kernel and measure its outputs."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from worker.context import AuditContext
from worker.generic.promote import GenericOracle
from worker.inputs import Case
from worker.numerics import checks
from worker.probes.distributions import ProbeInputError, ProbeSources, build_probe_case
from worker.probes.outcome import ProbeOutcome
from worker.problem_spec import AuditSpec, ProbeSpec
from worker.sandbox.protocol import CallReply
from worker.stages.probes.calls import KERNEL_FAILURES, call_kernel, positions
from worker.stages.probes.measure import input_stats, measure
from worker.stages.probes.oracle import (
    REFERENCE_ORACLE_SLACK,
    oracle_outputs,
    own_precision_if_it_disagrees,
    reference_runs,
    slack,
)
from worker.stages.probes.plan import jittered
from worker.stages.probes.stage import NAME

Call = tuple[str, list[Any], list[Any]]  # (label, inputs before, digests of them after)


@dataclass
class ProbeRuns:
    """Every probe's outcome, and what the behavioural checks and the report need."""

    oracle: Callable[..., Any]
    # how inputs were drawn from the user's token statistics, for the report
    notes: list[str] = field(default_factory=list)
    outcomes: list[ProbeOutcome] = field(default_factory=list)
    # every kernel call so far, for the inputs-unmodified check
    calls: list[Call] = field(default_factory=list)
    # the probes the kernel answered: their case and reply, for the behavioural checks
    ran: dict[str, tuple[Case, CallReply]] = field(default_factory=dict)

    @property
    def applicable(self) -> list[ProbeOutcome]:
        return [o for o in self.outcomes if o.not_applicable is None]


@dataclass
class _Yardstick:
    """What a probe's outputs are measured against."""

    ref: list[torch.Tensor] | None = None  # None: the oracle runs after the kernel
    honest: dict[str, list[torch.Tensor]] | None = None
    slack: float = 1.0


def run_probes(ctx: AuditContext, spec: AuditSpec, jitter: bool) -> ProbeRuns:
    """Each of the spec's probes in turn (`jitter`: at axes drawn for this audit)."""
    problem = ctx.problem
    oracle = problem.oracle(ctx.reference, device=ctx.device)
    sources = ProbeSources(
        reference=ctx.reference,
        workloads=problem.workloads(ctx.profile),
        token_stats=problem.token_stats,
    )
    runs = ProbeRuns(oracle=oracle)
    for probe in spec.probes:
        ctx.progress(f"probes: {probe.name}")
        outcome, case, reply = run_probe(ctx, spec, probe, oracle, sources, runs.notes, jitter=jitter)
        runs.outcomes.append(outcome)
        if case is not None and reply is not None:
            runs.calls.append((probe.name, case.args(problem.definition), reply.args_after))
            runs.ran[probe.name] = (case, reply)
    return runs


def run_probe(
    ctx: AuditContext,
    spec: AuditSpec,
    probe: ProbeSpec,
    oracle: Callable[..., Any],
    sources: ProbeSources,
    notes: list[str],
    jitter: bool = False,
) -> tuple[ProbeOutcome, Case | None, CallReply | None]:
    """One probe: its outcome; its case and the kernel's reply where the kernel ran."""
    seed = ctx.derive_seed(NAME, probe.name)
    outcome = ProbeOutcome(
        name=probe.name,
        why=probe.why,
        adversarial=probe.adversarial,
        advisory=probe.advisory,
        seed=seed,
        spec=probe.model_dump(exclude_none=True),
        noncontiguous=probe.noncontiguous,
    )
    case = _build_case(ctx, probe, seed, sources, notes, jitter, outcome)
    if case is None:
        return outcome, None, None
    yardstick = _Yardstick()
    if isinstance(oracle, GenericOracle):
        generic = _generic_yardstick(ctx, spec, oracle, case, outcome)
        if generic is None:
            return outcome, None, None
        yardstick = generic
    try:
        with _timed(outcome, "kernel", ctx.device):
            noncontiguous = positions(ctx, probe.noncontiguous)
            reply = call_kernel(ctx, case, checks.POISON_A, noncontiguous)
    except KERNEL_FAILURES as err:
        outcome.kernel_error = f"{type(err).__name__}: {err}"[:600]
        return outcome, case, None
    ref = yardstick.ref
    if ref is None:
        with _timed(outcome, "oracle", ctx.device):
            ref = oracle_outputs(oracle, case, ctx)
    with _timed(outcome, "measure", ctx.device):
        outcome.outputs = measure(ctx, spec, case, reply.outputs, ref, yardstick.slack, yardstick.honest)
    return outcome, case, reply


def _build_case(
    ctx: AuditContext,
    probe: ProbeSpec,
    seed: int,
    sources: ProbeSources,
    notes: list[str],
    jitter: bool,
    outcome: ProbeOutcome,
) -> Case | None:
    """The probe's inputs, built in the trusted process; None (and outcome.input_error)
    where the spec cannot be built."""
    try:
        with _timed(outcome, "inputs", ctx.device):
            drawn = jittered(ctx, probe) if jitter else probe
            case = build_probe_case(
                ctx.problem.definition,
                drawn,
                ctx.profile,
                seed,
                sources,
                notes,
                device=ctx.device,
            )
            outcome.axes = case.axes
            outcome.input_stats = input_stats(case, ctx.device)
    except ProbeInputError as err:
        outcome.input_error = str(err)
        return None
    return case


def _generic_yardstick(
    ctx: AuditContext,
    spec: AuditSpec,
    oracle: GenericOracle,
    case: Case,
    outcome: ProbeOutcome,
) -> _Yardstick | None:
    """The promoted reference's outputs, run before the kernel: a derived probe the
    definition's own reference rejects does not apply (None), and is no kernel failure.

    The kernel is judged against what honest implementations achieve as well as the
    ideal output, except where the reference's own result depends on precision; then
    the reference itself is the oracle (oracle.own_precision_if_it_disagrees)."""
    try:
        with _timed(outcome, "oracle", ctx.device):
            ref = oracle_outputs(oracle, case, ctx)
    except Exception as err:  # noqa: BLE001 - the reference's own error on these inputs
        msg = f"the reference rejects these inputs: {type(err).__name__}: {err}"
        outcome.not_applicable = msg[:400]
        return None
    oracle_slack = slack(oracle)  # after the run: the budget follows its precision
    with _timed(outcome, "honest", ctx.device):
        runs = reference_runs(ctx, case)
        own = own_precision_if_it_disagrees(ctx, spec, case, ref, runs)
    if own is not None:
        ref, outcome.oracle_note = own
        return _Yardstick(ref=ref, slack=REFERENCE_ORACLE_SLACK)
    honest = runs if oracle_slack == 1.0 else None
    return _Yardstick(ref=ref, honest=honest, slack=oracle_slack)


@contextmanager
def _timed(outcome: ProbeOutcome, phase: str, device: str) -> Iterator[None]:
    """Adds the phase's wall time to outcome.timings, the GPU's queued work included (a
    sync at the end)."""
    t = time.perf_counter()
    try:
        yield
    finally:
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
        outcome.timings[phase] = outcome.timings.get(phase, 0.0) + time.perf_counter() - t
