"""Stage 5, canary: train a small decoder on real text with the kernel at its site, paired with the reference.

The submission trains in its own process and sends back weights; this process evaluates them on held-out text,
runs the reference and the null runs itself, checks the kernel's gradient on the reference's own trajectory against
fp64, and judges (rule: worker.canary.judge).

The modules, in the order the stage uses them: plan (the op's site, seed, text, init, checkpoints and how the two processes share
the host), runs (the reference's runs and their nulls here, beside the submission's training), submission (the
request to the submission's process and its reply, evaluated), losses (the held-out loss judgement, training the
nulls where only they can decide it), fidelity (the gradient against fp64), report (status, summary, metrics,
evidence).
"""

from __future__ import annotations

import torch

from worker.canary.binding import CanaryUnsupported, OpBinding
from worker.canary.profiles import CanaryProfile, profile_for
from worker.context import AuditContext
from worker.numerics.device_slots import SlotSettings, device_slot
from worker.stages.canary.fidelity import gradient_fidelity, max_ratios
from worker.stages.canary.losses import judge_losses
from worker.stages.canary.plan import choose_site, make_plan
from worker.stages.canary.report import Judgement, loss_curves, report
from worker.stages.canary.runs import train_side_by_side
from worker.stages.canary.stage import NAME, RULE
from worker.stages.canary.submission import UnusableReply, submission_runs
from worker.stages.result import StageResult, StageStatus

__all__ = ["NAME", "RULE", "run"]


def run(ctx: AuditContext, profile: CanaryProfile | None = None) -> StageResult:
    if ctx.profile == "cpu" and "triton" in ctx.solution.spec.languages:
        return StageResult(
            name=NAME,
            status=StageStatus.skipped,
            summary=(
                "not run on the CPU for a Triton kernel: under Triton's interpreter the canary's training takes 73-355 s, "
                "past its budget; audit on a GPU worker for the canary"
            ),
        )
    try:
        site = choose_site(ctx, profile or profile_for(ctx.profile))
    except CanaryUnsupported as err:
        return StageResult(name=NAME, status=StageStatus.error, summary=f"cannot place the op in the model: {err}")
    if site.binding is None:
        return StageResult(
            name=NAME,
            status=StageStatus.skipped,
            metrics={"site_match": site.how},
            summary=f"no canary for this op: it {site.how}; this does not count against the kernel",
        )
    p = site.profile
    previous = torch.get_num_threads()
    if p.threads:
        torch.set_num_threads(p.threads)
    try:
        # the training holds most of the canary's memory: only SlotSettings.canary_slots train at once on a GPU
        with device_slot(ctx.device, "canary", SlotSettings.from_env().canary_slots) as waited:
            if waited > 0.05:
                ctx.progress(f"canary: waited {waited:.1f} s for a training slot on {ctx.device}")
            try:
                result = _run(ctx, p, site.binding, site.how)
            finally:
                _give_back_cached(ctx.device)
        result.metrics["slot_wait_s"] = round(waited, 3)
        return result
    finally:
        torch.set_num_threads(previous)


def _give_back_cached(device: str) -> None:
    """The blocks the training freed go back to the card, inside the slot, for the next training there.

    Nothing of a canary stays alive after it (measured on the CPU: no tensor left after each of eight canaries, host
    memory flat), but the caching allocator keeps what a process freed: on an 80 GB H100, three benchmark processes
    running canary after canary held all of the card's memory by about the fifteenth run
    (benchmarks/results/h100-2026-12-06/fp20c_smi.log), and the next one ran out."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _run(ctx: AuditContext, p: CanaryProfile, binding: OpBinding, site_how: str) -> StageResult:
    plan = make_plan(ctx, p, binding, site_how)
    sandbox = ctx.sandbox()
    parent, reply = train_side_by_side(ctx, plan, sandbox)
    try:
        submission = submission_runs(plan, reply)
    except UnusableReply as err:
        return StageResult(name=NAME, status=StageStatus.failed, summary=str(err))
    losses, nulls_trained = judge_losses(ctx, plan, parent, submission)
    curves = loss_curves(plan, parent, submission, losses)
    sgd_states = parent["sgd"].states if "sgd" in parent else {}
    fid = gradient_fidelity(ctx, plan, sandbox, sgd_states)
    # a forward op's fidelity check judges its output; a backward op's (or a loss's grad_logits), its gradient
    checked = "gradient" if any(o.role.startswith("grad") for o in binding.outputs) else "output"
    judgement = Judgement(losses, nulls_trained, fid, max_ratios(ctx.problem.spec.budgets, binding), checked)
    return report(plan, judgement, curves)
