"""The held-out loss judgement, per optimiser (rule: worker.canary.judge.judge_loss).

A gap at or below the loss floor passes whatever the nulls say, so where the profile left them untrained
(CanaryProfile.lazy_nulls) they are trained only when some gap exceeds the floor in size, and the losses judged
again: the nulls can raise the threshold, never lower it. A gap below minus the floor passes the one-sided rule
too, but the nulls are trained for it all the same: a kernel's loss that far from the reference's says the training
is noisier than the floor assumes, and the report then shows how noisy (the null band) instead of "no null needed".
Where the profile asks (CanaryProfile.confirm_nulls), a gap still past the threshold is judged again against more
nulls before it fails the kernel.
"""

from __future__ import annotations

from worker.canary import judge
from worker.canary.profiles import Optimizer
from worker.context import AuditContext
from worker.stages.canary.plan import Plan
from worker.stages.canary.runs import ParentRuns, confirming, train_confirming_nulls, train_nulls
from worker.stages.canary.submission import SubmissionRun


def judge_losses(
    ctx: AuditContext, plan: Plan, parent: ParentRuns, submission: dict[Optimizer, SubmissionRun]
) -> tuple[list[judge.LossJudgement], bool]:
    """One judgement per optimiser, and whether the nulls were trained (with lazy nulls, into `parent`)."""
    losses = _judged(plan, parent, submission)
    nulls_trained = all(parent[opt].nulls_trained for opt in plan.profile.optimizers)
    if not nulls_trained and nulls_needed(losses, plan.profile.loss_floor):
        ctx.progress("canary: a held-out gap exceeds the floor in size; training the null runs")
        train_nulls(plan, parent)
        nulls_trained = True
        losses = _judged(plan, parent, submission)
    if nulls_trained and any(lj.exceeded for lj in losses) and confirming(plan, parent):
        ctx.progress("canary: a held-out gap exceeds the nulls' limit; training more nulls to confirm it")
        train_confirming_nulls(plan, parent)
        losses = _judged(plan, parent, submission)
    return losses, nulls_trained


def nulls_needed(losses: list[judge.LossJudgement], floor: float) -> bool:
    """Whether some gap is past the floor in size, either way (see the module's docstring)."""
    return any(lj.exceeded or abs(lj.mean_gap) > floor for lj in losses)


def _judged(plan: Plan, parent: ParentRuns, submission: dict[Optimizer, SubmissionRun]) -> list[judge.LossJudgement]:
    p = plan.profile
    return [
        judge.judge_loss(
            opt,
            plan.steps,
            parent[opt].heldout,
            submission[opt].heldout,
            parent[opt].null_heldout,
            p.band_factor,
            p.loss_floor,
        )
        for opt in p.optimizers
    ]
