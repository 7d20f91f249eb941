"""The kernel timed against the reference on the timing workload, so that the submission cannot forge either.

Every timed call has its own fresh inputs (none repeats, so nothing can be memoised) and fresh NaN-poisoned
outputs, and timed outputs are judged like a benchmark round (worker.stages.benchmark.passes). The speedup carries
a bootstrap interval (worker.numerics.speedup); an interval wider than the device's threshold is timed once more,
with fresh inputs, and the blocks pooled. The median must clear the physical floor (worker.stages.benchmark.floor).
CPU figures are indicative: round trips through the sandbox, on a host that other audits share."""

from __future__ import annotations

import statistics
from typing import Any

from worker.context import AuditContext
from worker.inputs import Case, build_case
from worker.numerics.speedup import SpeedupInterval
from worker.numerics.timing import CLOCK_LABEL, TimingSample, device_name, timing_config
from worker.numerics.timing_settings import TimingSettings
from worker.sandbox import Sandbox
from worker.sandbox.protocol import HelloRequest
from worker.stages.benchmark.calls import request
from worker.stages.benchmark.failure import Failure
from worker.stages.benchmark.floor import check_floor
from worker.stages.benchmark.passes import time_by_parent, time_in_child
from worker.stages.benchmark.reference_clock import time_reference
from worker.stages.benchmark.timed import ReferenceBlock, Timed, TimingPlan
from worker.stages.benchmark.workloads import timing_workload, tolerance_for


def time_kernel(
    ctx: AuditContext,
    sb: Sandbox,
    metrics: dict[str, Any],
    evidence: dict[str, Any],
    est_call_ms: float | None = None,
) -> str:
    """Time the kernel so that the submission cannot forge it (see worker.numerics.timing for what stays trusted);
    fills `metrics["timing"]` and returns the timing's part of the stage's summary. `est_call_ms`: the quickest
    correctness round on the timing workload, round trip included, which sizes a GPU pass to the timing budget
    (worker.stages.benchmark.timed.plan_blocks). A kernel slow in its rounds and quick when timed gains only a
    wider interval; one quick in its rounds and slow when timed is stopped at twice the budget."""
    problem, definition = ctx.problem, ctx.problem.definition
    w = timing_workload(problem, ctx.profile)
    cfg = timing_config(ctx.device)
    settings = TimingSettings.from_env()
    seed = ctx.derive_seed("benchmark", "timing", w.uuid)
    evidence["timing_seed"] = seed
    where = f"timing on workload {w.uuid}"
    ctx.progress(f"benchmark: {where}")
    gpu = ctx.device.startswith("cuda")
    tol = tolerance_for(problem, w)
    timing: dict[str, Any] = {"workload": w.uuid, "hardware": device_name(ctx.device), "indicative": not gpu}
    metrics["timing"] = timing
    metrics["indicative"] = not gpu
    plan = TimingPlan(ctx, sb, w, cfg, settings, tol, seed, where, gpu, est_call_ms)
    first = plan.fresh()
    # the first timed set again, made here: the reference's inputs, and the ids the floor counts rows by
    ref_args = build_case(definition, ctx.reference, w, seed, folder=problem.folder, device=ctx.device).args(definition)
    timed, est = _measure(plan, first, time_reference(ctx, ref_args, cfg), timing)
    kernel = timed.kernel_sample()
    check_floor(ctx, definition, ref_args, first, kernel, timing, where, settings.peak_bandwidth_bytes_per_s)
    timing.update(
        kernel_median_ms=kernel.median_ms, kernel_times_ms=kernel.times_ms if len(kernel.times_ms) <= 20 else None
    )
    metrics.update(kernel_median_ms=kernel.median_ms)
    return _describe(plan, timed, est, kernel, timing, metrics)


def _measure(
    plan: TimingPlan, first: Case, reference: ReferenceBlock | None, timing: dict[str, Any]
) -> tuple[Timed, SpeedupInterval | None]:
    """The first pass, and a second when the speedup's interval is too wide; the interval over both."""
    ctx = plan.ctx
    timed = Timed()
    run_pass = time_in_child if plan.gpu else time_by_parent
    run_pass(plan, first, reference, timed, check_seed=plan.seed, first_pass=True)
    _after_pass(ctx, plan.sb, timed, timing, plan.where)
    _record_budget(plan, timed, timing)
    boot_seed = ctx.derive_seed("benchmark", "bootstrap", plan.workload.uuid)
    est = timed.interval(boot_seed)
    timing["retimed"] = False
    if timed.cut_short or (plan.gpu and timed.request_wall_ms > plan.settings.timing_budget_s * 1e3 / 2):
        # a second pass would take the window past the budget: the interval is reported as it is
        timing["retime_skipped"] = "the timing budget"
    elif est is not None and est.rel_width > plan.settings.retime_threshold(ctx.device):
        timing.update(retimed=True, first_speedup_ci=est.ci)
        ctx.progress(f"benchmark: {plan.where}: the speedup's interval is {est.rel_width:.0%} wide; timing it again")
        run_pass(
            plan,
            plan.fresh(),
            reference,
            timed,
            check_seed=ctx.derive_seed("benchmark", "timing", "checks", 2),
            first_pass=False,
        )
        _after_pass(ctx, plan.sb, timed, timing, plan.where)
        est = timed.interval(boot_seed)
    return timed, est


def _record_budget(plan: TimingPlan, timed: Timed, timing: dict[str, Any]) -> None:
    """When the budget shaped the pass: the budget, the estimate it was applied to, and what it cut."""
    trimmed = any(p.trimmed for p in timed.plans)
    if trimmed or timed.cut_short:
        timing.update(
            budget_s=plan.settings.timing_budget_s,
            est_call_ms=plan.est_call_ms,
            budget_trimmed=trimmed,
            cut_short=timed.cut_short,
        )


def _after_pass(ctx: AuditContext, sb: Sandbox, timed: Timed, timing: dict[str, Any], where: str) -> None:
    """The process that answered is still there, nothing was tampered with; the window's record."""
    request(sb, ctx, HelloRequest(device=ctx.device), where)
    first = timed.kernel[0]
    timing.update(
        clock=first.clock,
        reps=timed.reps,
        warmup=timed.warmup,
        fresh_inputs=timed.fresh_inputs,
        blocks=len(timed.kernel),
        tampered=sorted(timed.tampered),
        checked_calls=timed.checked or None,
        exclusive=all(wr.exclusive for wr in timed.windows),
        lock_wait_s=sum(wr.lock_wait_s for wr in timed.windows),
        lock_path=timed.windows[-1].lock_path,
        clocks_locked=all(wr.clocks_locked for wr in timed.windows),
        clocks_note=timed.windows[-1].clocks_note,
    )
    if timed.request_wall_ms:
        timing["request_wall_ms"] = timed.request_wall_ms
    if timed.tampered:
        raise Failure(
            f"{where}: the submission replaced timer/checker functions {sorted(timed.tampered)}; its timing "
            "is not trusted",
            official="REWARD_HACK",
        )


def _describe(
    plan: TimingPlan,
    timed: Timed,
    est: SpeedupInterval | None,
    kernel: TimingSample,
    timing: dict[str, Any],
    metrics: dict[str, Any],
) -> str:
    """The speedup and its interval into `timing` and `metrics`; the sentence the stage's summary ends with."""
    blocks = f"{len(timed.kernel)} interleaved blocks" if est is not None else f"{len(timed.kernel)} blocks"
    clock_note = (
        f"{CLOCK_LABEL[kernel.clock]}, median of {len(kernel.times_ms)}, {blocks}, workload {plan.workload.uuid}"
    )
    if not plan.gpu:
        clock_note += "; indicative only: round trips through the sandbox on a shared CPU"
    if "budget_s" in timing:
        why = (
            "the pass ran past twice the budget"
            if timing.get("cut_short")
            else f"a correctness round took {(plan.est_call_ms or 0.0) / 1e3:.2g} s or more"
        )
        clock_note += (
            f"; {timed.reps} timed calls, not {plan.cfg.reps}: {why}, and one pass may take {timing['budget_s']:g} s "
            "(KAUDIT_TIMING_BUDGET_S)"
        )
    if est is None:
        return (
            f"{kernel.median_ms:.4f} ms ({clock_note}); no speedup: the uploaded reference runs in its own sandbox, "
            "whose round trips are not comparable with CUDA events"
        )
    ref_median = float(statistics.median([t for b in timed.reference for t in b.times_ms]))
    timing.update(
        reference_median_ms=ref_median,
        speedup=est.speedup,
        speedup_ci=est.ci,
        speedup_ci_level=est.level,
        speedup_ci_method=est.method,
        speedup_ci_rel_width=est.rel_width,
    )
    metrics.update(reference_median_ms=ref_median, speedup=est.speedup, speedup_ci=est.ci)
    phrase = f"{_speed_phrase(est.speedup)} ({est.level:.0%} interval {_interval(est.speedup, est.lo, est.hi)}; {clock_note})"
    if kernel.host_median_ms is not None:
        timing.update(kernel_host_median_ms=kernel.host_median_ms, launch_bound=kernel.launch_bound)
        if kernel.launch_bound:
            # reported by the child, so informative only: it never changes a verdict
            phrase += (
                f"; host-bound: the host is busy {kernel.host_median_ms:.3f} ms of the call's {kernel.median_ms:.3f} ms "
                "(launch overhead, or a host-device sync inside the call), so its time depends on the CPU, not only the GPU"
            )
    return phrase


def _speed_phrase(speedup: float) -> str:
    return f"{speedup:.2f}x faster than reference" if speedup >= 1 else f"{1 / speedup:.2f}x slower than reference"


def _interval(speedup: float, lo: float, hi: float) -> str:
    """The speedup's interval in the unit its phrase uses: as a slowdown (1/speedup) where the kernel is slower, so
    that "40x slower" reads with an interval around 40x, not around 0.025x."""
    if speedup >= 1:
        return f"{lo:.3g}x-{hi:.3g}x"
    return f"{1 / hi:.3g}x-{1 / lo:.3g}x" if lo > 0 else f"{1 / hi:.3g}x-inf"
