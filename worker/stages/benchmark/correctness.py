"""The correctness rounds: ROUNDS rounds per workload, each on fresh inputs seeded from the audit's secret seed.

The reference runs here, in the trusted process, on a pristine copy; the kernel runs in the sandbox into
NaN-poisoned output buffers, so an output it never writes cannot pass; each output is judged by the elementwise
rule in worker.numerics.tolerance. The timed passes judge their checked calls with the same rule (`check_round`)."""

from __future__ import annotations

import time

from collections.abc import Sequence
from typing import Any

import torch

from worker import generated
from worker.context import AuditContext
from worker.formats import Definition, Workload
from worker.inputs import Case, build_case
from worker.numerics.dtypes import to_torch
from worker.numerics.tolerance import OutputComparison, compare_output
from worker.problem_spec import Tolerance
from worker.sandbox import Sandbox
from worker.sandbox.protocol import CallRequest, output_specs
from worker.stages.benchmark.calls import request
from worker.stages.benchmark.failure import Failure, interpreter_bf16_failure, made_mismatch
from worker.stages.benchmark.report import Ledger
from worker.stages.benchmark.stage import ROUNDS
from worker.stages.benchmark.workloads import reference_outputs
from worker.stages.result import StageStatus


def run_rounds(
    ctx: AuditContext, sb: Sandbox, workloads: Sequence[Workload], tols: dict[str, Tolerance], ledger: Ledger
) -> None:
    """Every round of every workload, in order; the first output out of tolerance raises Failure."""
    remote = ctx.makes_inputs_in_child
    for w in workloads:
        ledger.current = w.uuid
        for r in range(ROUNDS):
            _one_round(ctx, sb, w, r, tols[w.uuid], ledger, remote=remote)


def _one_round(
    ctx: AuditContext, sb: Sandbox, w: Workload, r: int, tol: Tolerance, ledger: Ledger, *, remote: bool
) -> None:
    problem, definition = ctx.problem, ctx.problem.definition
    where = f"workload {w.uuid}, round {r + 1}/{ROUNDS}"
    ctx.progress(f"benchmark: {where}")
    seed = ctx.derive_seed("benchmark", w.uuid, r)
    ledger.seeds[w.uuid].append(seed)
    # on a GPU both sides make the random inputs on the device from their recipes (worker.generated)
    case = build_case(definition, ctx.reference, w, seed, folder=problem.folder, device=ctx.device, lazy=remote)
    wire = case.wire_args(definition)
    made = sorted(case.recipes(definition))
    args = case.args(definition)
    ref = reference_outputs(ctx, args)
    t0 = time.perf_counter()
    reply = request(
        sb, ctx, CallRequest(args=wire, outputs=output_specs(case.output_specs(definition)), poison=float("nan")), where
    )
    ledger.round_trip_ms.setdefault(w.uuid, []).append((time.perf_counter() - t0) * 1e3)
    check_made([args[i] for i in made], reply.made_digests, where)
    ledger.mutated.update(inputs_mutated(definition, args, reply.args_after))
    try:
        comparisons = check_round(definition, case, reply.outputs, ref, tol, where, exact=reply.exact_tensor_types)
    except Failure as f:
        if reply.interpreter_bf16 is not None and f.official == "INCORRECT_NUMERICAL":
            raise interpreter_bf16_failure(where, reply.interpreter_bf16, f) from f
        raise
    for c in comparisons:
        ledger.stats[w.uuid].add(c)
    ledger.stats[w.uuid].rounds_passed += 1


def _official_of(out: Any, ref: torch.Tensor, dtype: str) -> str:
    """The status SOL-ExecBench records for an output that fails the comparison."""
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(ref.shape):
        return "INCORRECT_SHAPE"
    if out.dtype != to_torch(dtype):
        return "INCORRECT_DTYPE"
    return "INCORRECT_NUMERICAL"


def _wrong_output(summary: str, official: str, timed: bool, **evidence: Any) -> Failure:
    """An output out of the rule. In a timed call, after every correctness round passed, that means the output
    depends on being timed, which SOL-ExecBench records as REWARD_HACK (its driver checks the calls it times on
    fresh inputs for the same reason)."""
    if timed:
        summary += "; right in every correctness round, wrong in a timed call: the output depends on being timed"
        official = "REWARD_HACK"
    return Failure(summary, official=official, **evidence)


def check_round(
    definition: Definition,
    case: Case,
    outs: list[torch.Tensor],
    ref: list[torch.Tensor],
    tol: Tolerance,
    where: str,
    *,
    exact: list[bool] | None = None,
    timed: bool = False,
) -> list[OutputComparison]:
    """`outs` against `ref`; `exact`: per output, whether the kernel returned a plain tensor (a call's reply says);
    `timed`: the outputs of a timed call (`_wrong_output`)."""
    names = list(definition.outputs)
    if len(outs) != len(names):
        raise _wrong_output(
            f"{where}: the kernel gave {len(outs)} output(s), the definition has {len(names)} ({names})",
            "INCORRECT_SHAPE",
            timed,
        )
    subclassed = [n for n, e in zip(names, exact or []) if not e]
    if subclassed:
        raise Failure(
            f"{where}: output(s) {subclassed} came back as a torch.Tensor subclass; results must be plain tensors "
            "(a subclass can defer its work into the checker, outside the timed region)",
            official="REWARD_HACK",
        )
    if len(ref) != len(names):
        raise Failure(
            f"{where}: the reference gave {len(ref)} outputs for {len(names)} declared",
            StageStatus.error,
            official="INVALID_REFERENCE",
        )
    comparisons = []
    for name, out, r in zip(names, outs, ref):
        c = compare_output(name, out, r, to_torch(definition.outputs[name].dtype), tol)
        comparisons.append(c)
        if not c.ok:
            raise _wrong_output(
                f"{where}: {c.reason}",
                _official_of(out, r, definition.outputs[name].dtype),
                timed,
                comparison=c.model_dump(),
            )
    return comparisons


def check_made(made: list[torch.Tensor], digests: object, where: str) -> None:
    """The inputs the child made from recipes for one call must be the ones this process made: their digests agree.

    A mismatch is the auditor's problem (a child on another card or torch build) or a forger's; either way no
    output can be judged against this process's reference, and the stage is inconclusive, not failed."""
    if made and digests != [generated.digest(t) for t in made]:
        raise made_mismatch(where)


def inputs_mutated(definition: Definition, args: list[Any], after: list[Any]) -> list[str]:
    """The inputs the kernel wrote into: `after` is a call's `args_after` (tensors, or digests of inputs made in
    the child)."""
    mutated = []
    for name, before, now in zip(definition.inputs, args, after):
        if isinstance(before, torch.Tensor) and generated.is_digest(now):  # made in the child: compared by digest
            if now[generated.DIGEST_KEY] != generated.digest(before):
                mutated.append(name)
        elif (
            isinstance(before, torch.Tensor)
            and isinstance(now, torch.Tensor)
            and (now.shape != before.shape or now.dtype != before.dtype or not torch.equal(now, before))
        ):
            mutated.append(name)
    return mutated
