"""Stage 3, benchmark: what SOL-ExecBench's own verifier does, so "passes the benchmark" means the same here.

For each workload: ROUNDS rounds of fresh inputs (seeded from the audit's secret
seed); the reference runs here, in the trusted process, on a pristine copy; the
kernel runs in the sandbox into NaN-poisoned output buffers; each output is judged
by the elementwise rule in worker.numerics.tolerance. Then the kernel is timed against the
reference timed here, so that the submission cannot forge it (`_time`): fresh inputs and
poisoned outputs for every timed call, timed outputs judged; on the GPU CUDA events in the
sandbox (L2 flushed, median) checked against this process's wall clock and the bandwidth
floor; on the CPU this process's own wall clock around each call.
"""

from __future__ import annotations

import io
import math
from datetime import UTC, datetime
import random
import time
from typing import Any

import torch
from pydantic import BaseModel

from worker import generated
from worker.catalogue import Problem, Profile
from worker.context import AuditContext
from worker.formats import Definition, Workload
from worker.inputs import Case, build_case
from worker.numerics.dtypes import to_torch
from worker.numerics.timing import (
    CLOCK_LABEL,
    GPU_BANDWIDTH_BYTES_PER_S,
    TimingConfig,
    TimingSample,
    bandwidth_floor_ms,
    time_trusted,
    timing_config,
)
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


TIMING_POOL_BYTES = 4 * 1024**3  # GPU: the timed calls' distinct input sets together stay under this
TIMING_CHECKS = 5  # GPU: timed calls whose outputs the parent judges, drawn at random after the inputs


def _time(ctx: AuditContext, sb: Sandbox, metrics: dict[str, Any], evidence: dict[str, Any]) -> str:
    """Time the kernel so that the submission cannot forge it (see worker.numerics.timing for what stays trusted).

    Every timed call has its own fresh inputs (none repeats, so nothing can be memoised) and fresh
    NaN-poisoned outputs, and outputs of timed calls are judged like a benchmark round. CPU: the parent
    times each call's round trip with its own clock and judges every output. GPU: the child times with
    CUDA events; the parent judges a random sample, checks the claimed times against its own wall
    clock and against the bandwidth floor."""
    problem, definition = ctx.problem, ctx.problem.definition
    w = timing_workload(problem, ctx.profile)
    cfg = timing_config(ctx.device)
    seed = ctx.derive_seed("benchmark", "timing", w.uuid)
    evidence["timing_seed"] = seed
    where = f"timing on workload {w.uuid}"
    ctx.progress(f"benchmark: {where}")
    gpu = ctx.device.startswith("cuda")
    # on the GPU the input sets stay recipes: the child makes them on its device, this process only the ones it checks
    first = build_case(definition, ctx.reference, w, seed, folder=problem.folder, device=ctx.device, lazy=gpu)
    case_bytes = first.nbytes(definition)
    out_bytes = sum(math.prod(o["shape"]) * to_torch(o["dtype"]).itemsize for o in first.output_specs(definition))
    # one input set per call; on the GPU one more for the warm-up calls
    calls = min(cfg.reps, max(1, TIMING_POOL_BYTES // max(1, case_bytes))) + 1 if gpu else cfg.warmup + cfg.reps
    cases = [first] + [build_case(definition, ctx.reference, w, ctx.derive_seed("benchmark", "timing", w.uuid, i),
                                  folder=problem.folder, device=ctx.device, lazy=gpu)
                       for i in range(1, calls)]
    tol = tolerance_for(problem, w)
    timing: dict[str, Any] = {"workload": w.uuid, "warmup": cfg.warmup, "fresh_inputs": len(cases)}
    metrics["timing"] = timing
    if gpu:
        kernel, tampered = _time_in_child(ctx, sb, cases, cfg, tol, seed, where, timing)
    else:
        kernel, tampered = _time_by_parent(ctx, sb, cases, cfg, tol, where)
    _request(sb, ctx, "hello", {"device": ctx.device}, where)  # the process that answered is still there
    timing.update(clock=kernel.clock, reps=len(kernel.times_ms), tampered=tampered)
    if tampered:
        raise _Failure(f"{where}: the submission replaced timer/checker functions {tampered}; its timing is not trusted",
                       official="REWARD_HACK")
    floor = bandwidth_floor_ms(case_bytes + out_bytes, ctx.device)
    timing["bandwidth_floor_ms"] = floor
    if floor is not None and kernel.median_ms < floor:
        raise _Failure(
            f"{where}: the kernel claims {kernel.median_ms:.4f} ms, below the {floor:.4f} ms that moving its "
            f"{case_bytes + out_bytes} bytes takes at {GPU_BANDWIDTH_BYTES_PER_S / 1e12:.1f} TB/s; its timing is not trusted"
        )
    timing.update(kernel_median_ms=kernel.median_ms,
                  kernel_times_ms=kernel.times_ms if len(kernel.times_ms) <= 20 else None)
    metrics.update(kernel_median_ms=kernel.median_ms)
    clock_note = f"{CLOCK_LABEL[kernel.clock]}, median of {len(kernel.times_ms)}, workload {w.uuid}"
    ref = _time_reference(ctx, first.args(definition), cfg)
    if ref is None:
        return (f"{kernel.median_ms:.4f} ms ({clock_note}); no speedup: the uploaded reference runs in its own sandbox, "
                "whose round trips are not comparable with CUDA events")
    speedup = ref.median_ms / kernel.median_ms
    timing.update(reference_median_ms=ref.median_ms, speedup=speedup)
    metrics.update(reference_median_ms=ref.median_ms, speedup=speedup)
    phrase = f"{_speed_phrase(speedup)} ({clock_note})"
    if kernel.host_median_ms is not None:
        timing.update(kernel_host_median_ms=kernel.host_median_ms, launch_bound=kernel.launch_bound)
        if kernel.launch_bound:
            # reported by the child, so informative only: it never changes a verdict
            phrase += (
                f"; host-bound: the host is busy {kernel.host_median_ms:.3f} ms of the call's {kernel.median_ms:.3f} ms "
                "(launch overhead, or a host-device sync inside the call), so its time depends on the CPU, not only the GPU"
            )
    return phrase


def _time_reference(ctx: AuditContext, args: list[Any], cfg: TimingConfig) -> TimingSample | None:
    """The reference timed as the kernel was: on the GPU with CUDA events here; on the CPU as a round trip (the
    same serialisation in process, or, for an uploaded reference, its own sandbox's real round trip). An uploaded
    reference cannot be timed with events on the GPU: None."""
    fn = ctx.reference.run_fn
    gpu = ctx.device.startswith("cuda")
    if not ctx.problem.reference_trusted:
        if gpu:
            return None
        return time_trusted(lambda: fn(*args), ctx.device, cfg)  # its sandbox's round trip, like the kernel's
    dev_args = to_device(args, ctx.device)
    with torch.no_grad():
        return time_trusted(lambda: fn(*dev_args) if gpu else _with_transport(fn, dev_args), ctx.device, cfg)


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


def _time_by_parent(ctx: AuditContext, sb: Sandbox, cases: list[Case], cfg: TimingConfig, tol: Tolerance,
                    where: str) -> tuple[TimingSample, list[str]]:
    """CPU: each call is one request; its round trip on this process's clock is the time (IPC included, so a
    kernel can only look slower than it is); every output is judged."""
    definition = ctx.problem.definition
    times: list[float] = []
    tampered: set[str] = set()
    for i, case in enumerate(cases):
        args = case.args(definition)
        payload = {"args": args, "outputs": case.output_specs(definition), "poison": float("nan")}
        t0 = time.perf_counter()
        reply = _request(sb, ctx, "call", payload, f"{where}, call {i + 1}", liveness=False)
        wall_ms = (time.perf_counter() - t0) * 1e3
        tampered.update(str(t) for t in reply.get("tampered", []))
        _check_round(definition, case, reply, reference_outputs(ctx, args), tol, f"{where}, timed call {i + 1}")
        if i >= cfg.warmup:
            times.append(wall_ms)
    return TimingSample(times_ms=times, clock="wall_clock_cpu"), sorted(tampered)


def _time_in_child(ctx: AuditContext, sb: Sandbox, cases: list[Case], cfg: TimingConfig, tol: Tolerance, seed: int,
                   where: str, timing: dict[str, Any]) -> tuple[TimingSample, list[str]]:
    """GPU: one request times every case once with CUDA events in the child; the parent checks what it can."""
    definition = ctx.problem.definition
    wire = [c.wire_args(definition) for c in cases]  # before this process makes any of them
    made = [sorted(c.recipes(definition)) for c in cases]
    reps = len(cases) - 1  # the last input set is the warm-up calls'
    check = sorted(random.Random(seed).sample(range(reps), min(TIMING_CHECKS, reps)))
    timing["checked_calls"] = check
    payload = {
        "args": [a for args in wire for a in args], "n_args": len(wire[0]),
        "outputs": cases[0].output_specs(definition), "poison": float("nan"), "check": check,
        "warmup": cfg.warmup, "reps": reps, "flush_l2": cfg.flush_l2,
    }
    t0 = time.perf_counter()
    reply = _request(sb, ctx, "time", payload, where, liveness=False)
    wall_ms = (time.perf_counter() - t0) * 1e3
    times, clock, host = reply.get("times_ms"), reply.get("clock"), reply.get("host_times_ms")
    if (
        clock != "cuda_events"
        or not isinstance(times, list)
        or len(times) != reps
        or not all(isinstance(t, float) and math.isfinite(t) and t > 0 for t in times)
    ):
        raise _Failure(f"{where}: the timing reply is malformed (clock {clock!r}, {len(times) if isinstance(times, list) else 0} samples)")
    timing["request_wall_ms"] = wall_ms
    if sum(times) > wall_ms:
        raise _Failure(f"{where}: the kernel claims {sum(times):.1f} ms of device time within {wall_ms:.1f} ms of wall "
                       "time measured here; its timing is forged")
    outs = reply.get("outputs")
    n_out = len(definition.outputs)
    if reply.get("checked") != check or not isinstance(outs, list) or len(outs) != n_out * len(check):
        raise _Failure(f"{where}: the timed calls' outputs did not come back as asked (calls {check})")
    digests = reply.get("made_digests")
    if any(made[i] for i in check) and (not isinstance(digests, list) or len(digests) != len(check)):
        raise _made_mismatch(where)
    for k, i in enumerate(check):  # one checked set made at a time, and dropped after
        args = cases[i].args(definition)
        _check_made([args[j] for j in made[i]], digests[k] if isinstance(digests, list) else None, where)
        one = {"outputs": outs[k * n_out:(k + 1) * n_out]}
        _check_round(definition, cases[i], one, reference_outputs(ctx, args), tol, f"{where}, timed call {i + 1}")
        cases[i].release()
    host_ok = isinstance(host, list) and len(host) == len(times) and all(isinstance(t, float) and math.isfinite(t) for t in host)
    sample = TimingSample(times_ms=times, clock=clock, host_times_ms=host if host_ok else None)
    return sample, [str(t) for t in reply.get("tampered", [])]
