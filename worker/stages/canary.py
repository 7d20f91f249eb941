"""Stage 5, canary: train a small decoder on real text with the kernel at its site, paired with the reference.

The submission trains in its own process and sends back weights; this process evaluates them
on held-out text, runs the reference and the null runs itself, checks the kernel's gradient on
the reference's own trajectory against fp64, and judges (rule: worker.canary.judge).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from worker.canary import checkpoint_wire, judge, parent_cache, speed
from worker.canary.binding import CanaryUnsupported, Kernel, OpBinding, bind
from worker.canary.data import canary_text
from worker.canary.model import init_state
from worker.canary.profiles import CanaryProfile, Optimizer, profile_for
from worker.canary.stacked import parent_thread, train_stacked
from worker.canary.train import (
    State,
    capture_op_args,
    heldout_loss,
    perturbed_kernel,
    reference_kernel,
)
from worker.context import AuditContext
from worker.numerics.placement import on_device_or_cpu
from worker.stages.result import StageResult, StageStatus
from worker.text.tokenizer import cache_dir

NAME = "canary"

RULE = (
    "fails if the kernel's output on the op's real arguments along the reference run exceeds the budget ratio "
    "(default 4x) of the ideal output's fp64 error in any bucket of rows, or if, per optimiser, the mean over "
    "checkpoints of the paired held-out loss gap (submission - reference, same seed/init/batches) exceeds "
    "max(band_factor x largest |null gap|, loss_floor); nulls = reference reruns and reference with its op "
    "output moved 1 ulp on a random half of elements"
)


def run(ctx: AuditContext, profile: CanaryProfile | None = None) -> StageResult:
    spec = ctx.problem.spec.canary
    if ctx.profile == "cpu" and "triton" in ctx.solution.spec.languages:
        return StageResult(name=NAME, status=StageStatus.skipped, summary=(
            "not run on the CPU for a Triton kernel: under Triton's interpreter the canary's training takes 73-355 s, "
            "past its budget; audit on a GPU worker for the canary"))
    if spec is None:
        return StageResult(name=NAME, status=StageStatus.skipped,
                           summary="no canary for this op: it fits no canary site (embedding, embedding_norm, norm, loss) "
                                   "named in audit.json canary.site; this does not count against the kernel")
    p = profile or profile_for(ctx.profile)
    try:
        binding = bind(spec.site, ctx.problem.definition)
    except CanaryUnsupported as err:
        return StageResult(name=NAME, status=StageStatus.error, summary=f"cannot place the op in the model: {err}")
    previous = torch.get_num_threads()
    if p.threads:
        torch.set_num_threads(p.threads)
    try:
        return _run(ctx, p, binding)
    finally:
        torch.set_num_threads(previous)


def _run(ctx: AuditContext, p: CanaryProfile, binding: OpBinding) -> StageResult:
    t0 = time.perf_counter()
    device = ctx.device
    seed = ctx.derive_seed("canary")
    if p.seed_pool:
        seed = parent_cache.pooled_seed(seed, p.seed_pool)
    text = canary_text(p, seed, ctx.problem.token_stats)  # the built-in text, or the user's token statistics
    batches, held = text.batches, text.heldout
    init = init_state(p, binding.site, seed)
    ref: Kernel = reference_kernel(ctx.reference.run_fn)
    steps = [s for s in p.checkpoints if s <= p.steps]
    timings: dict[str, float] = {}

    def evaluate(states: dict[int, State]) -> list[float]:
        return [heldout_loss(p, binding.site, states[s], held, device) for s in steps]

    # every parent run trains together, stacked, in one pass (worker.canary.stacked): per optimiser the reference,
    # its reruns and its 1-ulp perturbations; meanwhile the submission trains one run per optimiser in its process
    # (with p.lazy_nulls the nulls train later, only if a gap exceeds the floor: see `train_nulls`)
    null_kinds = ["rerun"] * p.repeat_runs + ["perturbed_1ulp"] * p.perturbed_runs

    def members(reference: bool, nulls: bool) -> tuple[list[Kernel], list[Optimizer]]:
        kernels: list[Kernel] = []
        opts: list[Optimizer] = []
        for opt in p.optimizers:
            group = ([ref] if reference else []) + ([ref] * p.repeat_runs + [
                perturbed_kernel(ref, seed + 1000 + i, device) for i in range(p.perturbed_runs)] if nulls else [])
            kernels += group
            opts += [opt] * len(group)
        return kernels, opts
    stop = threading.Event()  # set when this stage unwinds early: the parent's training stops at its next step
    # on the CPU the submission's process holds p.threads cores while it trains its runs, half as many as the parent's:
    # once it has finished, the parent's training takes those cores too
    child_done = threading.Event()
    widen = (child_done, 2 * p.threads) if torch.device(device).type == "cpu" and p.threads else None

    cache_key = parent_cache.key(
        definition=ctx.problem.definition.model_dump_json(), binding=binding.model_dump_json(), profile=p.model_dump_json(),
        device=device, seed=seed, batches=batches, heldout=held, init=init) if p.seed_pool else None

    # on the CPU the submission's process trains alone when the parent's runs will be read back: it gets the
    # parent's cores too (an entry unreadable after all costs only this; on a GPU the thread count is left as it is)
    hit = cache_key is not None and parent_cache.has(cache_dir(), cache_key)
    child_threads = (2 * p.threads if hit and widen is not None else p.threads) or 0
    timings["submission_threads"] = child_threads
    # on the CPU the submission's training limit follows how fast this host is right now (worker.canary.speed): a
    # correct kernel on a busy host must not end inconclusive for the auditor's own reasons
    child_timeout_s = p.child_timeout_s
    if torch.device(device).type == "cpu":
        factor = speed.slowdown()
        child_timeout_s = round(p.child_timeout_s * factor, 1)
        timings["host_slowdown"] = round(factor, 2)
    timings["submission_timeout_s"] = child_timeout_s

    def parent_runs() -> dict[Optimizer, dict[str, Any]]:
        if cache_key is not None:
            cached = parent_cache.load(cache_dir(), cache_key)
            if cached is not None:
                timings["parent_read_from_cache"] = 1.0
                return cached  # type: ignore[return-value]
        runs = train_parent_runs()
        store(runs)
        return runs

    def store(runs: dict[Optimizer, dict[str, Any]]) -> None:
        if cache_key is not None:  # weights are kept only where the fidelity check reads them: SGD's, at its steps
            parent_cache.store(cache_dir(), cache_key, {opt: {**r, "states": {s: st for s, st in r["states"].items()
                                                                              if opt == "sgd" and s in p.fidelity_steps}}
                                                        for opt, r in runs.items()})

    def train_parent_runs() -> dict[Optimizer, dict[str, Any]]:
        with_nulls = not p.lazy_nulls or not null_kinds
        kernels, member_opts = members(reference=True, nulls=with_nulls)
        per_opt = 1 + (len(null_kinds) if with_nulls else 0)
        with parent_thread(device, p.threads):
            t = time.perf_counter()
            first: dict[str, float] = {}
            outs = train_stacked(p, binding, kernels, init, batches, member_opts, device, tuple(steps), stop=stop, widen=widen,
                                 timings=first)
            timings["parent_train_s"] = round(time.perf_counter() - t, 2)
            if "first_step_s" in first:
                timings["parent_first_step_s"] = first["first_step_s"]
            t = time.perf_counter()
            evals = [evaluate(o.checkpoints) for o in outs]
            timings["parent_eval_s"] = round(time.perf_counter() - t, 2)
        runs: dict[Optimizer, dict[str, Any]] = {}
        for j, opt in enumerate(p.optimizers):
            first = j * per_opt
            runs[opt] = {"eval": evals[first], "train": outs[first].losses, "states": outs[first].checkpoints,
                         "nulls": evals[first + 1:first + per_opt], "null_kinds": null_kinds if with_nulls else [],
                         "nulls_trained": with_nulls}
        return runs

    def train_nulls(runs: dict[Optimizer, dict[str, Any]]) -> None:
        """The null runs of every optimiser, stacked in one pass, after the submission's process has finished (so
        on the CPU on the cores of both); added to `runs` and to its cache entry."""
        kernels, member_opts = members(reference=False, nulls=True)
        with parent_thread(device, p.threads):
            t = time.perf_counter()
            outs = train_stacked(p, binding, kernels, init, batches, member_opts, device, tuple(steps), stop=stop, widen=widen)
            evals = [evaluate(o.checkpoints) for o in outs]
            timings["parent_nulls_train_s"] = round(time.perf_counter() - t, 2)
        for j, opt in enumerate(p.optimizers):
            runs[opt].update(nulls=evals[j * len(null_kinds):(j + 1) * len(null_kinds)], null_kinds=null_kinds, nulls_trained=True)
        store(runs)

    # the submission trains in its own process while this one runs the reference and the nulls
    sandbox = ctx.sandbox()

    def submission_runs() -> tuple[dict[str, Any], float]:
        t = time.perf_counter()
        reply = sandbox.request(
            "canary_train",
            {"profile": p.model_dump(mode="json"), "binding": binding.model_dump(mode="json"), "init": init,
             "batches": batches, "optimizers": list(p.optimizers), "checkpoints": steps, "seed": seed,
             "threads": child_threads},
            timeout_s=child_timeout_s,
        )
        return reply, time.perf_counter() - t

    ctx.progress("canary: submission training in its process; reference and null runs here")
    torch.manual_seed(seed)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="canary") as pool:
        try:
            child = pool.submit(submission_runs)
            child.add_done_callback(lambda _f: child_done.set())
            parent = parent_runs()
            t = time.perf_counter()
            reply, secs = child.result()  # a SandboxError from the child propagates (the engine judges it)
            timings["waited_for_submission_s"] = round(time.perf_counter() - t, 2)
            timings["submission_train_s"] = round(secs, 2)
            reported = reply.get("first_step_s") if isinstance(reply, dict) else None
            if isinstance(reported, float) and 0 <= reported <= secs:  # the child's own clock: evidence only, never judged
                timings["submission_first_step_s_reported"] = round(reported, 3)
        except BaseException:
            stop.set()
            raise
    runs = reply.get("runs")
    if not isinstance(runs, list) or [r.get("optimizer") if isinstance(r, dict) else None for r in runs] != list(p.optimizers):
        return StageResult(name=NAME, status=StageStatus.failed,
                           summary=f"the submission's training sent back no run per optimiser {list(p.optimizers)}")
    replies = {opt: r for opt, r in zip(p.optimizers, runs)}
    outputs = reply.get("outputs")
    try:
        if any(r.get("checkpoint_steps") != steps for r in runs):
            raise ValueError(f"its runs name other checkpoint steps than {steps}")
        if not isinstance(outputs, list) or len(outputs) != 1:
            raise ValueError("it sent no single tensor of checkpoint weights")
        sub_weights = dict(zip(p.optimizers, checkpoint_wire.unpack(outputs[0], len(p.optimizers), steps, init)))
    except ValueError as err:
        return StageResult(name=NAME, status=StageStatus.failed, summary=f"the submission's training sent back unusable weights: {err}")
    ref_sgd_states: dict[int, State] = parent["sgd"]["states"] if "sgd" in parent else {}

    losses: list[judge.LossJudgement] = []
    curves: dict[str, Any] = {}
    t = time.perf_counter()
    sub_evals: dict[Optimizer, list[float]] = {}
    for opt in p.optimizers:
        sub_evals[opt] = evaluate(sub_weights[opt])
    timings["submission_eval_s"] = round(time.perf_counter() - t, 2)

    def judged() -> list[judge.LossJudgement]:
        return [judge.judge_loss(opt, steps, parent[opt]["eval"], sub_evals[opt], parent[opt]["nulls"], p.band_factor,
                                 p.loss_floor) for opt in p.optimizers]

    losses = judged()
    nulls_trained = all(parent[opt].get("nulls_trained", True) for opt in p.optimizers)
    if not nulls_trained and any(lj.exceeded for lj in losses):
        # a gap over the floor: only now can the nulls change the verdict (they can raise the threshold, never lower it)
        ctx.progress("canary: a held-out gap exceeds the floor; training the null runs")
        train_nulls(parent)
        nulls_trained = True
        losses = judged()
    for opt, lj in zip(p.optimizers, losses):
        curves[opt] = {
            "reference_train_loss": parent[opt]["train"],
            "submission_train_loss_reported": [float(x) for x in replies[opt].get("losses", [])],  # evidence only, never judged
            "heldout": lj.model_dump(),
            "null_kinds": parent[opt]["null_kinds"],
        }

    # gradient fidelity along the reference's own SGD trajectory, on real batches, against fp64
    ctx.progress("canary: gradient fidelity")
    t = time.perf_counter()
    fid: list[judge.BucketFidelity] = []
    oracle = ctx.problem.oracle(ctx.reference)
    budgets = ctx.problem.spec.budgets
    state_at = {0: init, **ref_sgd_states}
    input_names = [s.name for s in binding.inputs]
    for fstep in p.fidelity_steps:
        state = state_at.get(fstep)
        if state is None:
            continue
        seq = batches[min(fstep, p.steps - 1)]
        calls = capture_op_args(p, binding, ref, state, seq, device, p.fidelity_calls_per_step)
        for args in calls:
            specs = _specs_for(binding, args, ref, device)
            reply = sandbox.request("call", {"args": args, "outputs": specs})
            outs = reply["outputs"]
            exact = _exact(oracle, args, device)
            exact = list(exact) if isinstance(exact, (tuple, list)) else [exact]
            for spec, o, e in zip(binding.outputs, outs, exact):
                budget = budgets.get(spec.name)
                counts = None
                if budget is not None and budget.bucket_by is not None and budget.bucket_by.kind == "index_count":
                    idx = dict(zip(input_names, args)).get(budget.bucket_by.input or "")
                    if isinstance(idx, torch.Tensor):
                        counts = torch.bincount(idx.reshape(-1).long(), minlength=o.shape[0])
                fid.extend(judge.fidelity(fstep, spec.name, o, e, budget, counts))
    timings["fidelity_s"] = round(time.perf_counter() - t, 2)

    max_ratio = {s.name: (budgets[s.name].max_ratio if s.name in budgets else 4.0) for s in binding.outputs}
    fid_bad = [f for f in fid if f.ratio > max_ratio[f.output]]
    w = judge.worst(fid)
    loss_bad = [lj for lj in losses if lj.exceeded]
    by_opt = {lj.optimizer: lj for lj in losses}
    sgd_bad = "sgd" in by_opt and by_opt["sgd"].exceeded
    adam_ok = "adamw" in by_opt and not by_opt["adamw"].exceeded
    masked_by_adamw = bool(sgd_bad and adam_ok)

    parts = []
    for lj in losses:
        band = f"null band {lj.band:.4f}" if nulls_trained else "the floor; no null needed"
        parts.append(f"{lj.optimizer} held-out gap {lj.mean_gap:+.4f} (limit {lj.threshold:.4f}, {band})")
    if w is not None:
        parts.append(f"worst gradient bucket {w.output}[{w.bucket} contributions] {w.ratio:.1f}x the ideal error at step {w.step}")
    if fid_bad or loss_bad:
        status = StageStatus.failed
        why = []
        if fid_bad:
            f0 = max(fid_bad, key=lambda f: f.ratio)
            why.append(f"the op's gradient on real text is {f0.ratio:.1f}x the ideal error ({f0.output}, rows with {f0.bucket} contributions, "
                       f"rel err {f0.kernel_rel_err:.2e} vs {f0.ideal_rel_err:.2e}; budget {max_ratio[f0.output]:g}x)")
        for lj in loss_bad:
            why.append(f"with {lj.optimizer} the held-out loss is worse by {lj.mean_gap:+.4f} nats, beyond the noise limit {lj.threshold:.4f}")
        summary = "changes training beyond rounding: " + "; ".join(why)
        if masked_by_adamw:
            summary += f"; masked by AdamW (gap {by_opt['adamw'].mean_gap:+.4f}, inside the noise limit {by_opt['adamw'].threshold:.4f})"
        elif fid_bad and not loss_bad:
            summary += "; the held-out loss stays inside the noise band at this model size (" + "; ".join(parts[: len(losses)]) + ")"
    else:
        status = StageStatus.passed
        summary = "trains like the reference: " + "; ".join(parts)
    diagnosis = []
    if fid_bad and any(f.bucket not in ("1", "all") for f in fid_bad) and all(f.ratio <= max_ratio[f.output] for f in fid if f.bucket == "1"):
        diagnosis.append("error grows with the number of contributions per row: consistent with low-precision accumulation")
    metrics: dict[str, Any] = {
        "profile": p.name,
        "site": binding.site,
        "rule": RULE,
        "loss_gap": {lj.optimizer: lj.mean_gap for lj in losses},
        "loss_threshold": {lj.optimizer: lj.threshold for lj in losses},
        "noise_band": {lj.optimizer: lj.band if nulls_trained else None for lj in losses},
        "loss_exceeded": {lj.optimizer: lj.exceeded for lj in losses},
        "fidelity_worst_ratio": w.ratio if w is not None else None,
        "fidelity_failed": bool(fid_bad),
        "masked_by_adamw": masked_by_adamw,
        "runs": {"parent": len(p.optimizers) * (1 + (p.repeat_runs + p.perturbed_runs if nulls_trained else 0)),
                 "submission": len(p.optimizers)},
        # False: every gap was within the floor, which no null can lower, so the nulls were not trained (p.lazy_nulls)
        "nulls_trained": nulls_trained,
        "timings": {**timings, "total_s": round(time.perf_counter() - t0, 2)},
    }
    if diagnosis:
        metrics["diagnosis"] = diagnosis
    return StageResult(
        name=NAME,
        status=status,
        summary=summary,
        metrics=metrics,
        evidence={
            "seed": seed,
            "text": text.evidence,
            "profile": p.model_dump(mode="json"),
            "binding": binding.model_dump(mode="json"),
            "curves": curves,
            "fidelity": judge.summarise_fidelity(fid),
            "fidelity_all": [f.model_dump() for f in fid],
        },
    )


def _specs_for(binding: OpBinding, args: list[Any], ref: Kernel, device: str) -> list[dict[str, Any]]:
    """Output shapes for a direct call: the reference's outputs on the same arguments give them."""
    outs = ref([a.to(device) if isinstance(a, torch.Tensor) else a for a in args], [{"dtype": s.dtype} for s in binding.outputs])
    return [{"shape": list(o.shape), "dtype": s.dtype} for o, s in zip(outs, binding.outputs)]


def _exact(oracle: Any, args: list[Any], device: str) -> Any:
    """The fp64 oracle on the audit's device (a loss site's logits are 134M elements), or on the CPU where the
    device has no room for it (a GPU shared by several audits)."""
    return on_device_or_cpu(device, lambda d: oracle(*[a.to(d) if isinstance(a, torch.Tensor) else a for a in args]))
