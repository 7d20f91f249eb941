"""Stage 6, verdict: the worst stage, and a diagnosis where one can be made."""

from __future__ import annotations

from worker.report import WORKER_LIMIT
from worker.stages.result import AuditReport, StageResult, StageStatus, Verdict

NAME = "verdict"


def _ran_and_passed(stages: list[StageResult], name: str) -> bool | None:
    for s in stages:
        if s.name == name and s.status in (StageStatus.passed, StageStatus.failed):
            return s.status is StageStatus.passed
    return None


def retry_helps(stage: StageResult) -> bool:
    """Whether the same audit, retried, may reach a verdict: not where the worker itself falls short."""
    return WORKER_LIMIT not in stage.evidence


def judge(stages: list[StageResult]) -> StageResult:
    verdict = AuditReport.verdict_of(stages)
    # the stages of the verdict's own kind first (a failure where there is one), each kind in stage order
    kind = StageStatus.failed if verdict is Verdict.fail else StageStatus.error
    bad = sorted(
        (s for s in stages if s.status in (StageStatus.failed, StageStatus.error)), key=lambda s: s.status is not kind
    )
    if verdict is Verdict.pass_:
        ran = [s.name for s in stages if s.status is StageStatus.passed]
        summary = "pass: " + ", ".join(ran) + " passed"
        status = StageStatus.passed
    elif verdict is Verdict.fail:
        first = bad[0]
        diag = [d for s in bad for d in s.metrics.get("diagnosis", [])]
        summary = f"fail: caught by {first.name}: {first.summary}"
        if diag:
            summary += f" | diagnosis: {diag[0]}"
        unjudged = [s.name for s in bad if s.status is StageStatus.error]
        if unjudged:
            summary += f" | not judged (auditor error): {', '.join(unjudged)}"
        status = StageStatus.failed
    else:
        # the auditor's own limit or fault: never phrased as a catch, and the submitter is told what to do
        first = bad[0]
        if retry_helps(first):
            advice = "retry the audit (resubmit the same files)"
        else:
            advice = "this worker cannot judge it, and a retry here would not either"
        summary = f"error: inconclusive in {first.name}, not counted against the kernel; {advice}: {first.summary}"
        status = StageStatus.error
    return StageResult(
        name=NAME,
        status=status,
        summary=summary,
        metrics={
            "verdict": verdict.value,
            # the stages that judged the kernel wrong; an error verdict has none (inconclusive lists those)
            "caught_by": [s.name for s in bad if s.status is StageStatus.failed],
            "inconclusive": [s.name for s in bad if s.status is StageStatus.error],
            "retry": verdict is Verdict.error and retry_helps(bad[0]),
            # the benchmark's own judgement, and ours, reported separately (None: that stage did not run)
            "passes_benchmark": _ran_and_passed(stages, "benchmark"),
            "numerically_sound": _ran_and_passed(stages, "probes"),
        },
    )
