"""The submission's side of the canary: its process trains one run per optimiser from the plan's seed, init and
batches, and sends back its weights at every checkpoint, which this process evaluates on the held-out text itself.

What the child sends back is untrusted: a reply of the wrong shape is refused by the sandbox (MalformedReply); one
without one run per optimiser, or with weights of another shape, fails the stage (`UnusableReply`) instead of being
judged. The losses it reports are evidence only, never judged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from worker.canary import checkpoint_wire
from worker.canary.child_ops import CanaryTrainReply, CanaryTrainRequest, TrainedRun
from worker.canary.profiles import Optimizer
from worker.canary.train import State
from worker.stages.canary.plan import Plan
from worker.watched_sandbox import WatchedSandbox


class UnusableReply(Exception):
    """The submission's training sent back nothing this process can evaluate; the message is the stage's summary."""


@dataclass
class SubmissionRun:
    """One optimiser's run in the submission's process."""

    heldout: list[float]  # held-out loss at each checkpoint, evaluated here
    reply: TrainedRun  # the child's own record of the run

    @property
    def reported_losses(self) -> list[float]:
        """The training losses by the child's own account (evidence only)."""
        return list(self.reply.losses)


def request_training(plan: Plan, sandbox: WatchedSandbox) -> tuple[CanaryTrainReply, float]:
    """The child's reply and the seconds it took."""
    p = plan.profile
    t = time.perf_counter()
    reply = sandbox.send(
        CanaryTrainRequest(
            profile=p,
            binding=plan.binding,
            init=plan.init,
            batches=plan.batches,
            optimizers=list(p.optimizers),
            checkpoints=plan.steps,
            seed=plan.seed,
            threads=plan.child_threads,
        ),
        timeout_s=plan.child_timeout_s,
    )
    return reply, time.perf_counter() - t


def submission_runs(plan: Plan, reply: CanaryTrainReply) -> dict[Optimizer, SubmissionRun]:
    """The reply's runs, evaluated on the held-out text; raises UnusableReply."""
    optimizers = plan.profile.optimizers
    records, weights = _read(plan, reply)
    t = time.perf_counter()
    heldout = {opt: plan.evaluate(weights[opt]) for opt in optimizers}
    plan.timings["submission_eval_s"] = round(time.perf_counter() - t, 2)
    return {opt: SubmissionRun(heldout=heldout[opt], reply=records[opt]) for opt in optimizers}


def _read(plan: Plan, reply: CanaryTrainReply) -> tuple[dict[Optimizer, TrainedRun], dict[Optimizer, dict[int, State]]]:
    """Per optimiser the child's record of its run and its checkpoint weights."""
    optimizers = plan.profile.optimizers
    runs, outputs = reply.runs, reply.outputs
    if [r.optimizer for r in runs] != list(optimizers):
        raise UnusableReply(f"the submission's training sent back no run per optimiser {list(optimizers)}")
    try:
        if any(r.checkpoint_steps != plan.steps for r in runs):
            raise ValueError(f"its runs name other checkpoint steps than {plan.steps}")
        pieces = checkpoint_wire.unpack(
            outputs, len(optimizers), plan.steps, plan.init, plan.profile.wire_piece_elements
        )
        weights = dict(zip(optimizers, pieces))
    except ValueError as err:
        raise UnusableReply(f"the submission's training sent back unusable weights: {err}") from err
    return dict(zip(optimizers, runs)), weights
