"""One timed pass: kernel and reference alternate in blocks inside the device's exclusive timed window
(worker.numerics.timed_window), so that both see the same machine, and no other audit times on it meanwhile.

Every timed call has its own fresh inputs and NaN-poisoned outputs, and the outputs of timed calls are judged like
a correctness round, after the window closes so that judging costs the window nothing. On the CPU the parent
times each call's round trip with its own clock and judges every output; on the GPU the child times blocks with
CUDA events, which the parent checks against its own wall clock, and the parent judges a random sample."""

from __future__ import annotations

import math
import random
import time

import torch

from worker.inputs import Case
from worker.numerics.timed_window import timed_window
from worker.numerics.timing import TimingSample
from worker.sandbox.protocol import CallReply, CallRequest, TimeReply, TimeRequest, output_specs
from worker.stages.benchmark.calls import request
from worker.stages.benchmark.correctness import check_made, check_round
from worker.stages.benchmark.failure import Failure, made_mismatch
from worker.stages.benchmark.timed import (
    MIN_TIMED_CALLS,
    OVERRUN_FACTOR,
    TIMING_CHECKS,
    TIMING_POOL_BYTES,
    ReferenceBlock,
    Timed,
    TimingPlan,
    plan_blocks,
)
from worker.stages.benchmark.workloads import reference_outputs


def time_by_parent(
    plan: TimingPlan, first: Case, reference: ReferenceBlock | None, timed: Timed, *, check_seed: int, first_pass: bool
) -> None:
    """CPU: each kernel call is one request; its round trip on this process's clock is the time (IPC included, so
    a kernel can only look slower than it is). Kernel and reference alternate call by call (blocks of one), inside
    the timed window; every output is judged after it."""
    ctx, sb, cfg, where = plan.ctx, plan.sb, plan.cfg, plan.where
    definition = ctx.problem.definition
    warm = cfg.warmup if first_pass else 0
    cases = [first] + [plan.fresh() for _ in range(warm + cfg.reps - 1)]
    offset = timed.reps
    replies: list[CallReply] = []
    with timed_window(
        ctx.device, plan.settings, on_wait=lambda: ctx.progress(f"benchmark: {where}: waiting for the timing lock")
    ) as window:
        for i, case in enumerate(cases):
            call = CallRequest(
                args=case.args(definition), outputs=output_specs(case.output_specs(definition)), poison=float("nan")
            )
            t0 = time.perf_counter()
            reply = request(sb, ctx, call, f"{where}, call {offset + i + 1}", liveness=False)
            wall_ms = (time.perf_counter() - t0) * 1e3
            timed.tampered.update(reply.tampered)
            replies.append(reply)
            if i >= warm:
                timed.kernel.append(TimingSample(times_ms=[wall_ms], clock="wall_clock_cpu"))
                if reference is not None:
                    timed.reference.append(reference(cfg.warmup if first_pass and i == warm else 0, 1))
    timed.windows.append(window)
    timed.warmup += warm
    timed.fresh_inputs += len(cases)
    for i, (case, reply) in enumerate(zip(cases, replies)):
        args = case.args(definition)
        check_round(
            definition,
            case,
            reply.outputs,
            reference_outputs(ctx, args),
            plan.tol,
            f"{where}, timed call {offset + i + 1}",
            exact=reply.exact_tensor_types,
            timed=True,
        )


def _child_sample(reply: TimeReply, reps: int, wall_ms: float, where: str) -> TimingSample:
    """The child's CUDA-event times, if they are as many as asked, finite, positive and within the wall time
    measured here (the reply's types are checked already; its values are the submission's word)."""
    times, clock, host = reply.times_ms, reply.clock, reply.host_times_ms
    if clock != "cuda_events" or len(times) != reps or not all(math.isfinite(t) and t > 0 for t in times):
        raise Failure(f"{where}: the timing reply is malformed (clock {clock!r}, {len(times)} samples)")
    if sum(times) > wall_ms:
        raise Failure(
            f"{where}: the kernel claims {sum(times):.1f} ms of device time within {wall_ms:.1f} ms of wall "
            "time measured here; its timing is forged"
        )
    host_ok = host is not None and len(host) == len(times) and all(math.isfinite(t) for t in host)
    return TimingSample(times_ms=times, clock=clock, host_times_ms=host if host_ok else None)


def time_in_child(
    plan: TimingPlan, first: Case, reference: ReferenceBlock | None, timed: Timed, *, check_seed: int, first_pass: bool
) -> None:
    """GPU: blocks of timed calls, each one `time` request (CUDA events in the child), alternating with the
    reference's blocks timed here, inside the device's timed window; then the parent checks what it can."""
    ctx, sb, cfg, where = plan.ctx, plan.sb, plan.cfg, plan.where
    definition = ctx.problem.definition
    pool_cap = max(1, TIMING_POOL_BYTES // max(1, first.nbytes(definition)))
    split = plan_blocks(cfg, pool_cap, plan.est_call_ms, plan.settings.timing_budget_s)
    block, n_blocks = split.block, split.n_blocks
    timed.plans.append(split)
    if split.trimmed:
        ctx.progress(
            f"benchmark: {where}: a call takes up to {(plan.est_call_ms or 0.0) / 1e3:.2g} s, so "
            f"{block * n_blocks} timed calls in {n_blocks} blocks fit the {plan.settings.timing_budget_s:g} s budget"
        )
    budget_ms = plan.settings.timing_budget_s * 1e3
    cases = [first] + [plan.fresh() for _ in range(block * n_blocks - 1)]
    spare = plan.fresh()  # the warm-up calls' own input set, so that no timed call repeats one
    reps, offset = len(cases), timed.reps
    check = sorted(random.Random(check_seed).sample(range(reps), min(TIMING_CHECKS, reps)))
    wire = [c.wire_args(definition) for c in cases]  # before this process makes any of them
    spare_wire = spare.wire_args(definition)
    made = [sorted(c.recipes(definition)) for c in cases]
    specs, n_out = output_specs(first.output_specs(definition)), len(definition.outputs)
    pending: list[tuple[int, list[torch.Tensor], list[int] | None]] = []
    pass_start_ms = timed.request_wall_ms
    with timed_window(
        ctx.device, plan.settings, on_wait=lambda: ctx.progress(f"benchmark: {where}: waiting for the timing lock")
    ) as window:
        ran = 0
        for b in range(n_blocks):
            if ran >= MIN_TIMED_CALLS and timed.request_wall_ms - pass_start_ms > OVERRUN_FACTOR * budget_ms:
                timed.cut_short = True
                ctx.progress(
                    f"benchmark: {where}: past {OVERRUN_FACTOR:g}x the timing budget; stopped after {ran} calls"
                )
                break
            lo, hi = b * block, (b + 1) * block
            warm = split.warmup if first_pass and b == 0 else split.rewarm
            local = [i - lo for i in check if lo <= i < hi]
            block_request = TimeRequest(
                args=[a for args in [*wire[lo:hi], spare_wire] for a in args],
                n_args=len(spare_wire),
                outputs=specs,
                poison=float("nan"),
                check=local,
                warmup=warm,
                reps=hi - lo,
                flush_l2=cfg.flush_l2,
            )
            t0 = time.perf_counter()
            reply = request(sb, ctx, block_request, where, liveness=False)
            wall_ms = (time.perf_counter() - t0) * 1e3
            sample = _child_sample(reply, hi - lo, wall_ms, where)
            outs, digests = reply.outputs, reply.made_digests
            if reply.checked != local or len(outs) != n_out * len(local):
                raise Failure(
                    f"{where}: the timed calls' outputs did not come back as asked (calls {[offset + lo + i for i in local]})"
                )
            if any(made[lo + i] for i in local) and len(digests) != len(local):
                raise made_mismatch(where)
            for k, i in enumerate(local):
                pending.append((lo + i, outs[k * n_out : (k + 1) * n_out], digests[k] if k < len(digests) else None))
            timed.kernel.append(sample)
            timed.tampered.update(reply.tampered)
            timed.warmup += warm
            timed.request_wall_ms += wall_ms
            if reference is not None:
                timed.reference.append(reference(warm, hi - lo))
            ran = hi
    timed.windows.append(window)
    timed.fresh_inputs += ran + 1
    timed.checked += [offset + i for i in check if i < ran]
    for i, outs, made_digests in pending:  # one checked set made at a time, and dropped after
        args = cases[i].args(definition)
        check_made([args[j] for j in made[i]], made_digests, where)
        check_round(
            definition,
            cases[i],
            outs,
            reference_outputs(ctx, args),
            plan.tol,
            f"{where}, timed call {offset + i + 1}",
            timed=True,
        )
        cases[i].release()
