"""The canary's training: the reference's runs (the parent) and their nulls here, the submission's in its process.

Every parent run of a pass trains together, stacked, in one pass (worker.canary.stacked): per optimiser the
reference, its reruns and its 1-ulp perturbations, while the submission trains one run per optimiser in its own
process. With CanaryProfile.lazy_nulls the nulls are left out of that pass and trained later by `train_nulls`, only
if a gap exceeds the floor. The parent's runs depend only on trusted inputs, so with a seed pool they are read from
and kept in worker.canary.parent_cache.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, cast

import torch

from worker.canary import parent_cache
from worker.canary.binding import Kernel
from worker.canary.child_ops import CanaryTrainReply
from worker.canary.profiles import Optimizer
from worker.canary.stacked import parent_thread, train_stacked
from worker.canary.train import State, TrainOutput, perturbed_kernel
from worker.context import AuditContext
from worker.numerics import gpu_memory
from worker.stages.canary.plan import Plan
from worker.stages.canary.submission import request_training
from worker.text.tokenizer import cache_dir
from worker.watched_sandbox import WatchedSandbox


@dataclass
class CanaryRun:
    """One optimiser's reference run, with the held-out losses of its nulls."""

    heldout: list[float]  # held-out loss at each checkpoint
    train_losses: list[float]
    states: dict[int, State]  # weights at each checkpoint (read back from the cache: SGD's at its fidelity steps)
    null_heldout: list[list[float]]  # per null run, its held-out loss at each checkpoint
    null_kinds: list[str]
    nulls_trained: bool

    def entry(self, states: dict[int, State]) -> dict[str, Any]:
        """The cache entry's form (plain containers: the cache reads with torch.load(weights_only=True))."""
        return {
            "eval": self.heldout,
            "train": self.train_losses,
            "states": states,
            "nulls": self.null_heldout,
            "null_kinds": self.null_kinds,
            "nulls_trained": self.nulls_trained,
        }

    @classmethod
    def from_entry(cls, entry: dict[str, Any]) -> CanaryRun:
        return cls(
            heldout=entry["eval"],
            train_losses=entry["train"],
            states=entry["states"],
            null_heldout=entry["nulls"],
            null_kinds=entry["null_kinds"],
            nulls_trained=entry.get("nulls_trained", True),
        )


ParentRuns = dict[Optimizer, CanaryRun]


def train_side_by_side(ctx: AuditContext, plan: Plan, sandbox: WatchedSandbox) -> tuple[ParentRuns, CanaryTrainReply]:
    """The parent's runs and the submission's reply: its process trains while this one runs the reference and the
    nulls. A SandboxError from the child propagates (the engine judges it)."""
    ctx.progress("canary: submission training in its process; reference and null runs here")
    torch.manual_seed(plan.seed)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="canary") as pool:
        try:
            child = pool.submit(request_training, plan, sandbox)
            child.add_done_callback(lambda _f: plan.child_done.set())
            parent = parent_runs(plan)
            # what the parent's training freed goes back to the card while the submission may still be training
            gpu_memory.release(plan.device)
            t = time.perf_counter()
            reply, secs = child.result()
            plan.timings["waited_for_submission_s"] = round(time.perf_counter() - t, 2)
            plan.timings["submission_train_s"] = round(secs, 2)
            reported = reply.first_step_s
            if reported is not None and 0 <= reported <= secs:  # the child's own clock: evidence only, never judged
                plan.timings["submission_first_step_s_reported"] = round(reported, 3)
        except BaseException:
            plan.stop.set()  # the parent's training stops at its next step
            raise
    return parent, reply


def parent_runs(plan: Plan) -> ParentRuns:
    """Read back from the cache, or trained (and then kept there)."""
    if plan.cache_key is not None:
        cached = parent_cache.load(cache_dir(), plan.cache_key)
        if cached is not None:
            plan.timings["parent_read_from_cache"] = 1.0
            return cast(ParentRuns, {opt: CanaryRun.from_entry(entry) for opt, entry in cached.items()})
    runs = _train_parent(plan)
    _store(plan, runs)
    return runs


def _train_parent(plan: Plan) -> ParentRuns:
    p = plan.profile
    with_nulls = not p.lazy_nulls or not plan.null_kinds
    kernels, opts = _members(plan, reference=True, nulls=with_nulls)
    per_opt = 1 + (len(plan.null_kinds) if with_nulls else 0)
    with parent_thread(plan.device, p.threads):
        t = time.perf_counter()
        first: dict[str, float] = {}
        outs = _train(plan, kernels, opts, timings=first)
        plan.timings["parent_train_s"] = round(time.perf_counter() - t, 2)
        if "first_step_s" in first:
            plan.timings["parent_first_step_s"] = first["first_step_s"]
        t = time.perf_counter()
        evals = [plan.evaluate(o.checkpoints) for o in outs]
        plan.timings["parent_eval_s"] = round(time.perf_counter() - t, 2)
    runs: ParentRuns = {}
    for j, opt in enumerate(p.optimizers):
        i = j * per_opt
        runs[opt] = CanaryRun(
            heldout=evals[i],
            train_losses=outs[i].losses,
            states=outs[i].checkpoints,
            null_heldout=evals[i + 1 : i + per_opt],
            null_kinds=plan.null_kinds if with_nulls else [],
            nulls_trained=with_nulls,
        )
    return runs


def train_nulls(plan: Plan, runs: ParentRuns) -> None:
    """The null runs of every optimiser, stacked in one pass, after the submission's process has finished (so on the
    CPU on the cores of both); set in `runs` and in its cache entry."""
    kernels, opts = _members(plan, reference=False, nulls=True)
    with parent_thread(plan.device, plan.profile.threads):
        t = time.perf_counter()
        outs = _train(plan, kernels, opts)
        evals = [plan.evaluate(o.checkpoints) for o in outs]
        plan.timings["parent_nulls_train_s"] = round(time.perf_counter() - t, 2)
    n = len(plan.null_kinds)
    for j, opt in enumerate(plan.profile.optimizers):
        runs[opt] = replace(
            runs[opt], null_heldout=evals[j * n : (j + 1) * n], null_kinds=plan.null_kinds, nulls_trained=True
        )
    _store(plan, runs)


def confirming(plan: Plan, runs: ParentRuns) -> bool:
    """Whether the confirming nulls (CanaryProfile.confirm_nulls) are still to train: none in `runs` yet."""
    first = len(plan.null_kinds)
    return plan.profile.confirm_nulls > 0 and all(len(r.null_heldout) <= first for r in runs.values())


def train_confirming_nulls(plan: Plan, runs: ParentRuns) -> None:
    """CanaryProfile.confirm_nulls more 1-ulp nulls per optimiser, each from a generator of its own, appended to
    `runs` and kept in its cache entry (a later audit of the problem at this seed judges against all of them)."""
    p = plan.profile
    n = p.confirm_nulls
    kernels: list[Kernel] = []
    opts: list[Optimizer] = []
    for opt in p.optimizers:
        kernels += [perturbed_kernel(plan.ref, plan.seed + 1000 + p.perturbed_runs + i, plan.device) for i in range(n)]
        opts += [opt] * n
    with parent_thread(plan.device, p.threads):
        t = time.perf_counter()
        outs = _train(plan, kernels, opts)
        evals = [plan.evaluate(o.checkpoints) for o in outs]
        plan.timings["parent_confirm_nulls_train_s"] = round(time.perf_counter() - t, 2)
    for j, opt in enumerate(p.optimizers):
        run = runs[opt]
        runs[opt] = replace(
            run,
            null_heldout=[*run.null_heldout, *evals[j * n : (j + 1) * n]],
            null_kinds=[*run.null_kinds, *["perturbed_1ulp"] * n],
        )
    _store(plan, runs)


def _members(plan: Plan, reference: bool, nulls: bool) -> tuple[list[Kernel], list[Optimizer]]:
    """The stacked pass's kernels and each one's optimiser: per optimiser the reference and/or its nulls (each
    optimiser's 1-ulp nulls draw from their own generators)."""
    p = plan.profile
    kernels: list[Kernel] = []
    opts: list[Optimizer] = []
    for opt in p.optimizers:
        group = [plan.ref] if reference else []
        if nulls:
            group += [plan.ref] * p.repeat_runs
            group += [perturbed_kernel(plan.ref, plan.seed + 1000 + i, plan.device) for i in range(p.perturbed_runs)]
        kernels += group
        opts += [opt] * len(group)
    return kernels, opts


def _train(
    plan: Plan, kernels: list[Kernel], opts: list[Optimizer], timings: dict[str, float] | None = None
) -> list[TrainOutput]:
    return train_stacked(
        plan.profile,
        plan.binding,
        kernels,
        plan.init,
        plan.batches,
        opts,
        plan.device,
        tuple(plan.steps),
        stop=plan.stop,
        widen=plan.widen,
        timings=timings,
    )


def _store(plan: Plan, runs: ParentRuns) -> None:
    """Weights are kept only where the fidelity check reads them: SGD's, at its steps."""
    if plan.cache_key is None:
        return
    keep = plan.profile.fidelity_steps
    parent_cache.store(
        cache_dir(),
        plan.cache_key,
        {
            opt: run.entry({s: st for s, st in run.states.items() if opt == "sgd" and s in keep})
            for opt, run in runs.items()
        },
    )
