"""The canary's StageResult: status, summary, metrics and evidence from the loss and fidelity judgements.

The summary says which check failed and by how much against its limit; where both are passed it gives every gap
and the worst gradient bucket, so a pass shows its margins too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from worker.canary import judge
from worker.canary.profiles import Optimizer
from worker.stages.canary.plan import Plan
from worker.stages.canary.runs import ParentRuns
from worker.stages.canary.stage import NAME, RULE
from worker.stages.canary.submission import SubmissionRun
from worker.stages.result import StageResult, StageStatus


@dataclass
class Judgement:
    losses: list[judge.LossJudgement]  # per optimiser
    nulls_trained: bool  # False: every gap was within the floor, which no null can lower (CanaryProfile.lazy_nulls)
    fidelity: list[judge.BucketFidelity]
    max_ratio: dict[str, float]  # per output, its fidelity budget
    checked: str = "gradient"  # what the fidelity check judged: the op's "gradient", or a forward op's "output"

    @property
    def fid_bad(self) -> list[judge.BucketFidelity]:
        return [f for f in self.fidelity if f.ratio > self.max_ratio[f.output]]

    @property
    def loss_bad(self) -> list[judge.LossJudgement]:
        return [lj for lj in self.losses if lj.exceeded]

    @property
    def by_optimizer(self) -> dict[str, judge.LossJudgement]:
        return {lj.optimizer: lj for lj in self.losses}

    @property
    def masked_by_adamw(self) -> bool:
        """SGD's gap is over its limit and AdamW's inside it: AdamW alone would have hidden the kernel's effect."""
        by_opt = self.by_optimizer
        return bool("sgd" in by_opt and by_opt["sgd"].exceeded and "adamw" in by_opt and not by_opt["adamw"].exceeded)

    @property
    def diagnosis(self) -> list[str]:
        fid_bad = self.fid_bad
        if (
            fid_bad
            and any(f.bucket not in ("1", "all") for f in fid_bad)
            and all(f.ratio <= self.max_ratio[f.output] for f in self.fidelity if f.bucket == "1")
        ):
            return ["error grows with the number of contributions per row: consistent with low-precision accumulation"]
        return []


def loss_curves(
    plan: Plan, parent: ParentRuns, submission: dict[Optimizer, SubmissionRun], losses: list[judge.LossJudgement]
) -> dict[str, Any]:
    """Per optimiser the training losses of both sides and the held-out judgement: evidence."""
    return {
        opt: {
            "reference_train_loss": parent[opt].train_losses,
            "submission_train_loss_reported": submission[opt].reported_losses,  # evidence only, never judged
            "heldout": lj.model_dump(),
            "null_kinds": parent[opt].null_kinds,
        }
        for opt, lj in zip(plan.profile.optimizers, losses)
    }


def report(plan: Plan, j: Judgement, curves: dict[str, Any]) -> StageResult:
    status = StageStatus.failed if j.fid_bad or j.loss_bad else StageStatus.passed
    return StageResult(
        name=NAME,
        status=status,
        summary=_summary(j),
        metrics=_metrics(plan, j),
        evidence={
            "seed": plan.seed,
            "text": plan.text.evidence,
            "profile": plan.profile.model_dump(mode="json"),
            "binding": plan.binding.model_dump(mode="json"),
            "curves": curves,
            "fidelity": judge.summarise_fidelity(j.fidelity),
            **({"long_context": plan.long_context} if plan.long_context else {}),
            "fidelity_all": [f.model_dump() for f in j.fidelity],
        },
    )


def _on_window(f: judge.BucketFidelity) -> str:
    return f" on a window of {f.context} tokens" if f.context else ""


def _or_honest(f: judge.BucketFidelity) -> str:
    return " or the honest implementations' worst, whichever is larger" if f.honest_rel_err is not None else ""


def _honest(f: judge.BucketFidelity) -> str:
    return f", the honest implementations' worst {f.honest_rel_err:.2e}" if f.honest_rel_err is not None else ""


def _summary(j: Judgement) -> str:
    parts = []
    for lj in j.losses:
        band = f"null band {lj.band:.4f}" if j.nulls_trained else "the floor; no null needed"
        parts.append(f"{lj.optimizer} held-out gap {lj.mean_gap:+.4f} (limit {lj.threshold:.4f}, {band})")
    w = judge.worst(j.fidelity)
    if w is not None:
        parts.append(
            f"worst {j.checked} bucket {w.output}[{w.bucket} contributions] {w.ratio:.1f}x the ideal error at step {w.step}"
            + _on_window(w)
        )
    fid_bad, loss_bad = j.fid_bad, j.loss_bad
    if not (fid_bad or loss_bad):
        return "trains like the reference: " + "; ".join(parts)
    why = []
    if fid_bad:
        f0 = max(fid_bad, key=lambda f: f.ratio)
        if f0.ideal_rel_err == 0:  # an integer output (expert ids): the ideal is exact, so any error is infinitely more
            why.append(
                f"the op's {j.checked} on real text is off where the ideal one is exact ({f0.output}, rows with "
                f"{f0.bucket} contributions, rel err {f0.kernel_rel_err:.2e}; budget {j.max_ratio[f0.output]:g}x the ideal error)"
            )
        else:
            why.append(
                f"the op's {j.checked} on real text{_on_window(f0)} is {f0.ratio:.1f}x the ideal error{_or_honest(f0)} "
                f"({f0.output}, rows with {f0.bucket} contributions, rel err {f0.kernel_rel_err:.2e} vs "
                f"{f0.ideal_rel_err:.2e}{_honest(f0)}; budget {j.max_ratio[f0.output]:g}x)"
            )
    for lj in loss_bad:
        why.append(
            f"with {lj.optimizer} the held-out loss is worse by {lj.mean_gap:+.4f} nats, beyond the noise limit {lj.threshold:.4f}"
        )
    summary = "changes training beyond rounding: " + "; ".join(why)
    if j.masked_by_adamw:
        adamw = j.by_optimizer["adamw"]
        summary += f"; masked by AdamW (gap {adamw.mean_gap:+.4f}, inside the noise limit {adamw.threshold:.4f})"
    elif fid_bad and not loss_bad:
        summary += (
            "; the held-out loss stays inside the noise band at this model size ("
            + "; ".join(parts[: len(j.losses)])
            + ")"
        )
    return summary


def _metrics(plan: Plan, j: Judgement) -> dict[str, Any]:
    p = plan.profile
    w = judge.worst(j.fidelity)
    metrics: dict[str, Any] = {
        "profile": p.name,
        "site": plan.binding.site,
        "site_match": plan.site_how,
        "rule": RULE,
        "loss_gap": {lj.optimizer: lj.mean_gap for lj in j.losses},
        "loss_threshold": {lj.optimizer: lj.threshold for lj in j.losses},
        "noise_band": {lj.optimizer: lj.band if j.nulls_trained else None for lj in j.losses},
        "loss_exceeded": {lj.optimizer: lj.exceeded for lj in j.losses},
        "fidelity_worst_ratio": w.ratio if w is not None else None,
        "fidelity_failed": bool(j.fid_bad),
        # the model the op trained in: the profile's, or at the definition's constant sizes (worker.canary.sizing)
        "model": {
            "d_model": p.d_model,
            "n_layers": p.n_layers,
            "d_ff": p.d_ff,
            "parameters": sum(t.numel() for t in plan.init.values()),
            "sgd_lr": p.sgd_lr,
            "adamw_lr": p.adamw_lr,
        },
        "masked_by_adamw": j.masked_by_adamw,
        "runs": {
            "parent": sum(1 + len(lj.null_mean_gaps) for lj in j.losses),
            "submission": len(p.optimizers),
        },
        # False: every gap was within the floor, which no null can lower, so the nulls were not trained (p.lazy_nulls)
        "nulls_trained": j.nulls_trained,
        "timings": {**plan.timings, "total_s": round(time.perf_counter() - plan.started, 2)},
    }
    if j.diagnosis:
        metrics["diagnosis"] = j.diagnosis
    return metrics
