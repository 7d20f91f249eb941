"""Stage 3, benchmark: what SOL-ExecBench's own verifier does, so "passes the benchmark" means the same here.

For each workload: ROUNDS rounds of fresh inputs (seeded from the audit's secret
seed); the reference runs here, in the trusted process, on a pristine copy; the
kernel runs in the sandbox into NaN-poisoned output buffers; each output is judged
by the elementwise rule in worker.numerics.tolerance. Then the kernel is timed against the
reference timed here, so that the submission cannot forge it (`_time`): fresh inputs and
poisoned outputs for every timed call, timed outputs judged; on the GPU CUDA events in the
sandbox (L2 flushed, median) checked against this process's wall clock and the physical
floor; on the CPU this process's own wall clock around each call. Kernel and reference
alternate in blocks inside the device's exclusive timed window, and the speedup carries a
bootstrap interval.
"""

from __future__ import annotations

import io
import itertools
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import torch
from pydantic import BaseModel

from worker import generated
from worker.catalogue import Problem, Profile
from worker.context import AuditContext
from worker.formats import Definition, Workload
from worker.inputs import Case, build_case
from worker.numerics.dtypes import to_torch
from worker.numerics.floor import bytes_touched, device_peak_bandwidth, timing_floor
from worker.numerics.speedup import SpeedupInterval, speedup_interval
from worker.numerics.timed_window import WindowRecord, timed_window
from worker.numerics.timing import (
    CLOCK_LABEL,
    TimingConfig,
    TimingSample,
    device_name,
    time_trusted,
    timing_config,
)
from worker.numerics.timing_settings import TimingSettings
from worker.numerics.tolerance import OutputComparison, compare_output
from worker.problem_spec import Tolerance
from worker.sandbox import Sandbox, SandboxError
from worker.stages.result import StageResult, StageStatus
from worker.traces import environment_of

NAME = "benchmark"
ROUNDS = 10
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


class _Failure(Exception):
    """`official`: the status SOL-ExecBench's own evaluator would record for the workload (worker.traces)."""

    def __init__(self, summary: str, status: StageStatus = StageStatus.failed, *, official: str = "RUNTIME_ERROR",
                 **evidence: Any) -> None:
        super().__init__(summary)
        self.summary = summary
        self.status = status
        self.official = official
        self.evidence = evidence


def _request(sb: Sandbox, ctx: AuditContext, op: str, payload: dict[str, Any], where: str, *,
             liveness: bool = True) -> dict[str, Any]:
    """One op in the sandbox, then proof the process is still the one that answered.

    A submission can write a forged reply frame to the child's pipe and exit; the
    frame reads fine, but the process is gone. A round trip after every reply
    turns that into a crash the stage reports instead of trusting the reply.
    """
    try:
        reply = sb.request(op, payload)
    except SandboxError as err:
        status = StageStatus.error if err.kind in ("sandbox", "out_of_memory") else StageStatus.failed
        official = "TIMEOUT" if err.kind == "timeout" else "RUNTIME_ERROR"
        raise _Failure(f"{where}: the kernel failed ({err.kind}): {err}", status, official=official,
                       log=err.log[-2000:]) from err
    if not liveness:  # the caller checks later, outside the window it times
        return reply
    try:
        sb.request("hello", {"device": ctx.device}, timeout_s=60)
    except SandboxError as err:
        raise _Failure(
            f"{where}: the submission's process did not survive its own reply to '{op}' ({err.kind}); "
            "a reply followed by an exit is how a forged result channel looks, so the reply is not trusted",
            log=err.log[-2000:],
        ) from err
    return reply


class _WorkloadStats(BaseModel):
    rounds_passed: int = 0
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    min_match_fraction: float = 1.0

    def add(self, c: OutputComparison) -> None:
        self.max_abs_err = max(self.max_abs_err, c.max_abs_err or 0.0)
        self.max_rel_err = max(self.max_rel_err, c.max_rel_err or 0.0)
        if c.match_fraction is not None:
            self.min_match_fraction = min(self.min_match_fraction, c.match_fraction)


def _official_of(out: Any, ref: torch.Tensor, dtype: str) -> str:
    """The status SOL-ExecBench records for an output that fails the comparison."""
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(ref.shape):
        return "INCORRECT_SHAPE"
    if out.dtype != to_torch(dtype):
        return "INCORRECT_DTYPE"
    return "INCORRECT_NUMERICAL"


def _check_round(
    definition: Definition, case: Case, reply: dict[str, Any], ref: list[torch.Tensor], tol: Tolerance, where: str
) -> list[OutputComparison]:
    outs = reply.get("outputs")
    names = list(definition.outputs)
    if not isinstance(outs, list) or len(outs) != len(names):
        n = len(outs) if isinstance(outs, list) else 0
        raise _Failure(f"{where}: the kernel gave {n} output(s), the definition has {len(names)} ({names})",
                       official="INCORRECT_SHAPE")
    exact = reply.get("exact_tensor_types", [True] * len(outs))
    subclassed = [n for n, e in zip(names, exact) if not e]
    if subclassed:
        raise _Failure(
            f"{where}: output(s) {subclassed} came back as a torch.Tensor subclass; results must be plain tensors "
            "(a subclass can defer its work into the checker, outside the timed region)", official="REWARD_HACK"
        )
    if len(ref) != len(names):
        raise _Failure(f"{where}: the reference gave {len(ref)} outputs for {len(names)} declared", StageStatus.error,
                       official="INVALID_REFERENCE")
    comparisons = []
    for name, out, r in zip(names, outs, ref):
        c = compare_output(name, out, r, to_torch(definition.outputs[name].dtype), tol)
        comparisons.append(c)
        if not c.ok:
            raise _Failure(f"{where}: {c.reason}", official=_official_of(out, r, definition.outputs[name].dtype),
                           comparison=c.model_dump())
    return comparisons


def _check_made(made: list[torch.Tensor], digests: object, where: str) -> None:
    """The inputs the child made from recipes for one call must be the ones this process made: their digests agree.

    A mismatch is the auditor's problem (a child on another card or torch build) or a forger's; either way no
    output can be judged against this process's reference, and the stage is inconclusive, not failed."""
    if made and digests != [generated.digest(t) for t in made]:
        raise _made_mismatch(where)


def _made_mismatch(where: str) -> _Failure:
    return _Failure(
        f"{where}: the inputs the sandbox made from their seeds are not the ones this process made "
        "(another GPU or torch build in the sandbox, or a tampered generator); the outputs cannot be judged",
        StageStatus.error,
    )


def _inputs_mutated(definition: Definition, args: list[Any], reply: dict[str, Any]) -> list[str]:
    after = reply.get("args_after") or []
    mutated = []
    for name, before, now in zip(definition.inputs, args, after):
        if isinstance(before, torch.Tensor) and generated.is_digest(now):  # made in the child: compared by digest
            if now[generated.DIGEST_KEY] != generated.digest(before):
                mutated.append(name)
        elif isinstance(before, torch.Tensor) and isinstance(now, torch.Tensor):
            if now.shape != before.shape or now.dtype != before.dtype or not torch.equal(now, before):
                mutated.append(name)
    return mutated


def _speed_phrase(speedup: float) -> str:
    return f"{speedup:.2f}x faster than reference" if speedup >= 1 else f"{1 / speedup:.2f}x slower than reference"


def _tol_phrase(tol: Tolerance) -> str:
    t = f"atol=rtol={tol.atol:g}" if tol.atol == tol.rtol else f"atol={tol.atol:g}, rtol={tol.rtol:g}"
    return t


def run(ctx: AuditContext) -> StageResult:
    problem, definition = ctx.problem, ctx.problem.definition
    workloads = problem.workloads(ctx.profile)
    seeds: dict[str, list[int]] = {w.uuid: [] for w in workloads}
    evidence: dict[str, Any] = {"seeds": seeds, "workload_uuids": [w.uuid for w in workloads], "rounds": ROUNDS,
                                # what a SOL-ExecBench trace records of where and when (worker.traces)
                                "environment": environment_of(ctx.device).model_dump(),
                                "evaluated_at": datetime.now(UTC).isoformat(timespec="seconds")}
    stats: dict[str, _WorkloadStats] = {w.uuid: _WorkloadStats() for w in workloads}
    metrics: dict[str, Any] = {"rounds": ROUNDS, "workloads": stats, "passes_benchmark": False}
    if not workloads:
        return StageResult(name=NAME, status=StageStatus.error, summary=f"no {ctx.profile} workloads for {problem.name}")
    mutated: set[str] = set()
    remote = ctx.makes_inputs_in_child
    current = workloads[0].uuid
    try:
        sb = ctx.sandbox()
        tols = {w.uuid: tolerance_for(problem, w) for w in workloads}
        for w in workloads:
            current = w.uuid
            for r in range(ROUNDS):
                where = f"workload {w.uuid}, round {r + 1}/{ROUNDS}"
                ctx.progress(f"benchmark: {where}")
                seed = ctx.derive_seed("benchmark", w.uuid, r)
                seeds[w.uuid].append(seed)
                # on a GPU both sides make the random inputs on the device from their recipes (worker.generated)
                case = build_case(definition, ctx.reference, w, seed, folder=problem.folder, device=ctx.device, lazy=remote)
                wire = case.wire_args(definition)
                made = sorted(case.recipes(definition))
                args = case.args(definition)
                ref = reference_outputs(ctx, args)
                reply = _request(
                    sb,
                    ctx,
                    "call",
                    {"args": wire, "outputs": case.output_specs(definition), "poison": float("nan")},
                    where,
                )
                _check_made([args[i] for i in made], reply.get("made_digests"), where)
                mutated.update(_inputs_mutated(definition, args, reply))
                for c in _check_round(definition, case, reply, ref, tols[w.uuid], where):
                    stats[w.uuid].add(c)
                stats[w.uuid].rounds_passed += 1
        current = timing_workload(problem, ctx.profile).uuid
        timing = _time(ctx, sb, metrics, evidence)
    except _Failure as f:
        # what SOL-ExecBench would record: the workloads before this one passed, this one failed so (worker.traces)
        metrics["official"] = {"workload": current, "status": f.official}
        metrics["inputs_mutated"] = sorted(mutated)
        evidence.update(f.evidence)
        return StageResult(
            name=NAME,
            status=f.status,
            summary=f.summary,
            metrics=_dump(metrics),
            evidence=evidence,
        )
    metrics["inputs_mutated"] = sorted(mutated)
    metrics["passes_benchmark"] = True
    tol_all = list(tols.values())
    min_frac = min(s.min_match_fraction for s in stats.values())
    same_tol = all(t == tol_all[0] for t in tol_all)
    summary = (
        f"{ROUNDS}/{ROUNDS} rounds x {len(workloads)} workload(s) within "
        f"{_tol_phrase(tol_all[0]) if same_tol else 'each workload tolerance'} (min {min_frac:.1%} of elements); "
        f"{timing}"
    )
    if mutated:
        summary += f"; note: the kernel modified its input(s) {sorted(mutated)}"
    return StageResult(name=NAME, status=StageStatus.passed, summary=summary, metrics=_dump(metrics), evidence=evidence)


def _dump(metrics: dict[str, Any]) -> dict[str, Any]:
    out = dict(metrics)
    out["workloads"] = {k: v.model_dump() for k, v in metrics["workloads"].items()}
    return out


TIMING_POOL_BYTES = 4 * 1024**3  # GPU: one request's distinct input sets together stay under this
TIMING_CHECKS = 5  # GPU: timed calls per pass whose outputs the parent judges, drawn at random after the inputs
GPU_BLOCK_REPS = 10  # GPU: timed calls per interleaved block (a CPU block is one call: each is a slow round trip)
GPU_MAX_BLOCKS = 20  # GPU: when few input sets fit the pool, more (smaller) blocks, up to this many
REWARM_CALLS = 2  # GPU: warm-up calls before every block after the first (the other side ran in between)
FLOOR_PHRASE = "timing below the physical floor, not trusted"

ReferenceBlock = Callable[[int, int], TimingSample]  # (warm-up calls, timed calls) -> one block of the reference
FreshCase = Callable[[], Case]


@dataclass
class _Timed:
    """What the timed passes measured, block by block; a re-time adds its blocks to the first pass's."""

    kernel: list[TimingSample] = field(default_factory=list)
    reference: list[TimingSample] = field(default_factory=list)
    tampered: set[str] = field(default_factory=set)
    warmup: int = 0
    fresh_inputs: int = 0
    checked: list[int] = field(default_factory=list)
    request_wall_ms: float = 0.0
    windows: list[WindowRecord] = field(default_factory=list)

    @property
    def reps(self) -> int:
        return sum(len(b.times_ms) for b in self.kernel)

    def kernel_sample(self) -> TimingSample:
        host = [h for b in self.kernel for h in (b.host_times_ms or [])]
        return TimingSample(times_ms=[t for b in self.kernel for t in b.times_ms], clock=self.kernel[0].clock,
                            host_times_ms=host if len(host) == self.reps else None)

    def interval(self, seed: int) -> SpeedupInterval | None:
        if not self.reference:
            return None
        return speedup_interval([b.times_ms for b in self.kernel], [b.times_ms for b in self.reference], seed=seed)


def _time(ctx: AuditContext, sb: Sandbox, metrics: dict[str, Any], evidence: dict[str, Any]) -> str:
    """Time the kernel so that the submission cannot forge it (see worker.numerics.timing for what stays trusted).

    Every timed call has its own fresh inputs (none repeats, so nothing can be memoised) and fresh
    NaN-poisoned outputs, and outputs of timed calls are judged like a benchmark round. CPU: the parent
    times each call's round trip with its own clock and judges every output. GPU: the child times with
    CUDA events; the parent judges a random sample, checks the claimed times against its own wall
    clock and the median against the physical floor (worker.numerics.floor; below it: inconclusive).

    The kernel's and the reference's timings alternate in blocks inside the device's exclusive timed window
    (worker.numerics.timed_window), and the speedup carries a bootstrap interval (worker.numerics.speedup); an
    interval wider than the device's threshold is timed once more, with fresh inputs, and the blocks pooled.
    CPU figures are indicative: round trips through the sandbox, on a host that other audits share."""
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
    counter = itertools.count()

    def fresh() -> Case:
        # on the GPU the input sets stay recipes: the child makes them on its device, this process only the ones it checks
        i = next(counter)
        case_seed = seed if i == 0 else ctx.derive_seed("benchmark", "timing", w.uuid, i)
        return build_case(definition, ctx.reference, w, case_seed, folder=problem.folder, device=ctx.device, lazy=gpu)

    first = fresh()
    # the first timed set again, made here: the reference's inputs, and the ids the floor counts rows by
    ref_args = build_case(definition, ctx.reference, w, seed, folder=problem.folder, device=ctx.device).args(definition)
    reference = _time_reference(ctx, ref_args, cfg)
    timed = _Timed()
    run_pass = _time_in_child if gpu else _time_by_parent
    run_pass(ctx, sb, first, fresh, cfg, tol, reference, settings, where, timed, check_seed=seed, first_pass=True)
    _after_pass(ctx, sb, timed, timing, where)
    boot_seed = ctx.derive_seed("benchmark", "bootstrap", w.uuid)
    est = timed.interval(boot_seed)
    timing["retimed"] = False
    if est is not None and est.rel_width > settings.retime_threshold(ctx.device):
        timing.update(retimed=True, first_speedup_ci=est.ci)
        ctx.progress(f"benchmark: {where}: the speedup's interval is {est.rel_width:.0%} wide; timing it again")
        run_pass(ctx, sb, fresh(), fresh, cfg, tol, reference, settings, where, timed,
                 check_seed=ctx.derive_seed("benchmark", "timing", "checks", 2), first_pass=False)
        _after_pass(ctx, sb, timed, timing, where)
        est = timed.interval(boot_seed)
    kernel = timed.kernel_sample()
    _check_floor(ctx, definition, ref_args, first, kernel, timing, where)
    timing.update(kernel_median_ms=kernel.median_ms,
                  kernel_times_ms=kernel.times_ms if len(kernel.times_ms) <= 20 else None)
    metrics.update(kernel_median_ms=kernel.median_ms)
    blocks = f"{len(timed.kernel)} interleaved blocks" if est is not None else f"{len(timed.kernel)} blocks"
    clock_note = f"{CLOCK_LABEL[kernel.clock]}, median of {len(kernel.times_ms)}, {blocks}, workload {w.uuid}"
    if not gpu:
        clock_note += "; indicative only: round trips through the sandbox on a shared CPU"
    if est is None:
        return (f"{kernel.median_ms:.4f} ms ({clock_note}); no speedup: the uploaded reference runs in its own sandbox, "
                "whose round trips are not comparable with CUDA events")
    ref_median = float(statistics.median([t for b in timed.reference for t in b.times_ms]))
    timing.update(reference_median_ms=ref_median, speedup=est.speedup, speedup_ci=est.ci, speedup_ci_level=est.level,
                  speedup_ci_method=est.method, speedup_ci_rel_width=est.rel_width)
    metrics.update(reference_median_ms=ref_median, speedup=est.speedup, speedup_ci=est.ci)
    phrase = f"{_speed_phrase(est.speedup)} ({est.level:.0%} interval {est.lo:.3g}x-{est.hi:.3g}x; {clock_note})"
    if kernel.host_median_ms is not None:
        timing.update(kernel_host_median_ms=kernel.host_median_ms, launch_bound=kernel.launch_bound)
        if kernel.launch_bound:
            # reported by the child, so informative only: it never changes a verdict
            phrase += (
                f"; host-bound: the host is busy {kernel.host_median_ms:.3f} ms of the call's {kernel.median_ms:.3f} ms "
                "(launch overhead, or a host-device sync inside the call), so its time depends on the CPU, not only the GPU"
            )
    return phrase


def _after_pass(ctx: AuditContext, sb: Sandbox, timed: _Timed, timing: dict[str, Any], where: str) -> None:
    """The process that answered is still there, nothing was tampered with; the window's record."""
    _request(sb, ctx, "hello", {"device": ctx.device}, where)
    first = timed.kernel[0]
    timing.update(clock=first.clock, reps=timed.reps, warmup=timed.warmup, fresh_inputs=timed.fresh_inputs,
                  blocks=len(timed.kernel), tampered=sorted(timed.tampered), checked_calls=timed.checked or None,
                  exclusive=all(wr.exclusive for wr in timed.windows),
                  lock_wait_s=sum(wr.lock_wait_s for wr in timed.windows), lock_path=timed.windows[-1].lock_path,
                  clocks_locked=all(wr.clocks_locked for wr in timed.windows), clocks_note=timed.windows[-1].clocks_note)
    if timed.request_wall_ms:
        timing["request_wall_ms"] = timed.request_wall_ms
    if timed.tampered:
        raise _Failure(f"{where}: the submission replaced timer/checker functions {sorted(timed.tampered)}; its timing "
                       "is not trusted", official="REWARD_HACK")


def _check_floor(ctx: AuditContext, definition: Definition, args: list[Any], first: Case, kernel: TimingSample,
                 timing: dict[str, Any], where: str) -> None:
    """The median call may not beat the bytes it must touch over the device's peak bandwidth (worker.numerics.floor).
    A breach is inconclusive: the stage is `error`, not `fail`."""
    touched = bytes_touched(definition, args, first.output_specs(definition))
    floor = timing_floor(touched.total, device_peak_bandwidth(ctx.device))
    timing["bandwidth_floor_ms"] = floor.floor_ms if floor is not None else None
    timing["floor"] = None if floor is None else {
        "bytes": touched.total, "output_bytes": touched.outputs, "input_bytes": touched.inputs,
        "tables": {k: v.model_dump() for k, v in touched.tables.items()},
        "bandwidth_bytes_per_s": floor.bandwidth.bytes_per_s, "bandwidth_source": floor.bandwidth.source}
    if floor is not None and floor.breached_by(kernel.median_ms):
        raise _Failure(
            f"{where}: {FLOOR_PHRASE}: the kernel claims {kernel.median_ms:.4f} ms, below the {floor.floor_ms:.4f} ms "
            f"that touching its {touched.total} bytes takes at {floor.bandwidth.bytes_per_s / 1e12:.2f} TB/s "
            f"({floor.bandwidth.source.replace('_', ' ')})",
            StageStatus.error,
        )


def _time_reference(ctx: AuditContext, args: list[Any], cfg: TimingConfig) -> ReferenceBlock | None:
    """The reference timed as the kernel is, one block at a time: on the GPU with CUDA events here; on the CPU as a
    round trip (the same serialisation in process, or, for an uploaded reference, its own sandbox's real round
    trip). An uploaded reference cannot be timed with events on the GPU: None."""
    fn = ctx.reference.run_fn
    gpu = ctx.device.startswith("cuda")

    def timer(call: Callable[[], object]) -> ReferenceBlock:
        def block(warmup: int, reps: int) -> TimingSample:
            with torch.no_grad():
                return time_trusted(call, ctx.device, TimingConfig(warmup=warmup, reps=reps, flush_l2=cfg.flush_l2))
        return block

    if not ctx.problem.reference_trusted:
        return None if gpu else timer(lambda: fn(*args))  # its sandbox's round trip, like the kernel's
    dev_args = to_device(args, ctx.device)
    return timer((lambda: fn(*dev_args)) if gpu else (lambda: _with_transport(fn, dev_args)))


def _with_transport(fn: Any, args: list[Any]) -> object:
    """`fn(*args)` with its arguments and results serialised and read back as a sandbox request and reply are
    (our own data: read without the weights-only guard the parent keeps for the child's replies)."""

    def through(obj: object) -> Any:
        buf = io.BytesIO()
        torch.save(obj, buf)
        buf.seek(0)
        return torch.load(buf, weights_only=False)

    out = fn(*through(args))
    return through(list(out) if isinstance(out, (tuple, list)) else [out])


def _time_by_parent(ctx: AuditContext, sb: Sandbox, first: Case, fresh: FreshCase, cfg: TimingConfig, tol: Tolerance,
                    reference: ReferenceBlock | None, settings: TimingSettings, where: str, timed: _Timed, *,
                    check_seed: int, first_pass: bool) -> None:
    """CPU: each kernel call is one request; its round trip on this process's clock is the time (IPC included, so
    a kernel can only look slower than it is). Kernel and reference alternate call by call (blocks of one), inside
    the timed window; every output is judged after it."""
    definition = ctx.problem.definition
    warm = cfg.warmup if first_pass else 0
    cases = [first] + [fresh() for _ in range(warm + cfg.reps - 1)]
    offset = timed.reps
    replies: list[dict[str, Any]] = []
    with timed_window(ctx.device, settings, on_wait=lambda: ctx.progress(f"benchmark: {where}: waiting for the timing lock")) as window:
        for i, case in enumerate(cases):
            payload = {"args": case.args(definition), "outputs": case.output_specs(definition), "poison": float("nan")}
            t0 = time.perf_counter()
            reply = _request(sb, ctx, "call", payload, f"{where}, call {offset + i + 1}", liveness=False)
            wall_ms = (time.perf_counter() - t0) * 1e3
            timed.tampered.update(str(t) for t in reply.get("tampered", []))
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
        _check_round(definition, case, reply, reference_outputs(ctx, args), tol, f"{where}, timed call {offset + i + 1}")


def _child_sample(reply: dict[str, Any], reps: int, wall_ms: float, where: str) -> TimingSample:
    times, clock, host = reply.get("times_ms"), reply.get("clock"), reply.get("host_times_ms")
    if (
        clock != "cuda_events"
        or not isinstance(times, list)
        or len(times) != reps
        or not all(isinstance(t, float) and math.isfinite(t) and t > 0 for t in times)
    ):
        raise _Failure(f"{where}: the timing reply is malformed (clock {clock!r}, {len(times) if isinstance(times, list) else 0} samples)")
    if sum(times) > wall_ms:
        raise _Failure(f"{where}: the kernel claims {sum(times):.1f} ms of device time within {wall_ms:.1f} ms of wall "
                       "time measured here; its timing is forged")
    host_ok = isinstance(host, list) and len(host) == len(times) and all(isinstance(t, float) and math.isfinite(t) for t in host)
    return TimingSample(times_ms=times, clock=clock, host_times_ms=host if host_ok else None)


def _time_in_child(ctx: AuditContext, sb: Sandbox, first: Case, fresh: FreshCase, cfg: TimingConfig, tol: Tolerance,
                   reference: ReferenceBlock | None, settings: TimingSettings, where: str, timed: _Timed, *,
                   check_seed: int, first_pass: bool) -> None:
    """GPU: blocks of timed calls, each one `time` request (CUDA events in the child), alternating with the
    reference's blocks timed here, inside the device's timed window; then the parent checks what it can."""
    definition = ctx.problem.definition
    block = min(GPU_BLOCK_REPS, max(1, TIMING_POOL_BYTES // max(1, first.nbytes(definition))))
    n_blocks = min(GPU_MAX_BLOCKS, max(1, math.ceil(cfg.reps / block)))
    cases = [first] + [fresh() for _ in range(block * n_blocks - 1)]
    spare = fresh()  # the warm-up calls' own input set, so that no timed call repeats one
    reps, offset = len(cases), timed.reps
    check = sorted(random.Random(check_seed).sample(range(reps), min(TIMING_CHECKS, reps)))
    wire = [c.wire_args(definition) for c in cases]  # before this process makes any of them
    spare_wire = spare.wire_args(definition)
    made = [sorted(c.recipes(definition)) for c in cases]
    specs, n_out = first.output_specs(definition), len(definition.outputs)
    pending: list[tuple[int, list[Any], object]] = []
    with timed_window(ctx.device, settings, on_wait=lambda: ctx.progress(f"benchmark: {where}: waiting for the timing lock")) as window:
        for b in range(n_blocks):
            lo, hi = b * block, (b + 1) * block
            warm = cfg.warmup if first_pass and b == 0 else REWARM_CALLS
            local = [i - lo for i in check if lo <= i < hi]
            payload = {
                "args": [a for args in [*wire[lo:hi], spare_wire] for a in args], "n_args": len(spare_wire),
                "outputs": specs, "poison": float("nan"), "check": local,
                "warmup": warm, "reps": hi - lo, "flush_l2": cfg.flush_l2,
            }
            t0 = time.perf_counter()
            reply = _request(sb, ctx, "time", payload, where, liveness=False)
            wall_ms = (time.perf_counter() - t0) * 1e3
            sample = _child_sample(reply, hi - lo, wall_ms, where)
            outs, digests = reply.get("outputs"), reply.get("made_digests")
            if reply.get("checked") != local or not isinstance(outs, list) or len(outs) != n_out * len(local):
                raise _Failure(f"{where}: the timed calls' outputs did not come back as asked (calls {[offset + lo + i for i in local]})")
            if any(made[lo + i] for i in local) and (not isinstance(digests, list) or len(digests) != len(local)):
                raise _made_mismatch(where)
            for k, i in enumerate(local):
                pending.append((lo + i, outs[k * n_out:(k + 1) * n_out], digests[k] if isinstance(digests, list) else None))
            timed.kernel.append(sample)
            timed.tampered.update(str(t) for t in reply.get("tampered", []))
            timed.warmup += warm
            timed.request_wall_ms += wall_ms
            if reference is not None:
                timed.reference.append(reference(warm, hi - lo))
    timed.windows.append(window)
    timed.fresh_inputs += reps + 1
    timed.checked += [offset + i for i in check]
    for i, outs, digests in pending:  # one checked set made at a time, and dropped after
        args = cases[i].args(definition)
        _check_made([args[j] for j in made[i]], digests, where)
        _check_round(definition, cases[i], {"outputs": outs}, reference_outputs(ctx, args), tol,
                     f"{where}, timed call {offset + i + 1}")
        cases[i].release()
