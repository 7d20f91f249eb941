"""The verdict from the stages' statuses (worker.stages.verdict, AuditReport.verdict_of)."""

from __future__ import annotations

from worker.stages import verdict
from worker.stages.result import AuditReport, StageResult, StageStatus, Verdict


def _stage(name: str, status: StageStatus) -> StageResult:
    return StageResult(name=name, status=status, summary=f"{name} {status.value}")


def test_a_failure_outranks_a_stage_the_auditor_could_not_judge() -> None:
    # measured on the H200 (2026-12-02, four audits sharing the card): a known-bad kernel failed the benchmark
    # and the probes, its canary errored, and the verdict was "error"
    stages = [
        _stage("benchmark", StageStatus.failed),
        _stage("probes", StageStatus.failed),
        _stage("canary", StageStatus.error),
    ]
    assert AuditReport.verdict_of(stages) is Verdict.fail
    judged = verdict.judge(stages)
    assert judged.status is StageStatus.failed and judged.metrics["verdict"] == "fail"
    assert judged.summary.startswith("fail: caught by benchmark: benchmark failed")
    assert judged.summary.endswith("not judged (auditor error): canary")
    assert judged.metrics["caught_by"] == ["benchmark", "probes"]
    assert judged.metrics["inconclusive"] == ["canary"]


def test_the_stage_that_decided_a_fail_comes_first_in_caught_by_even_after_an_earlier_error() -> None:
    # caught_by[0] is what the webhooks and the leaderboard show: it must name the failure, not the error before it
    judged = verdict.judge([_stage("probes", StageStatus.error), _stage("canary", StageStatus.failed)])
    assert judged.metrics["verdict"] == "fail"
    assert judged.metrics["caught_by"] == ["canary"]
    assert judged.metrics["inconclusive"] == ["probes"]
    assert judged.summary.startswith("fail: caught by canary")


def test_an_error_without_a_failure_is_an_error_and_all_passed_is_a_pass() -> None:
    assert (
        AuditReport.verdict_of([_stage("benchmark", StageStatus.passed), _stage("canary", StageStatus.error)])
        is Verdict.error
    )
    judged = verdict.judge([_stage("benchmark", StageStatus.passed), _stage("canary", StageStatus.error)])
    # the auditor's own limit is never phrased as a catch, and the summary says to retry
    assert judged.summary.startswith("error: inconclusive in canary") and "caught" not in judged.summary
    assert "retry" in judged.summary and judged.metrics["retry"] is True
    assert judged.metrics["caught_by"] == [] and judged.metrics["inconclusive"] == ["canary"]
    assert (
        AuditReport.verdict_of([_stage("benchmark", StageStatus.passed), _stage("canary", StageStatus.skipped)])
        is Verdict.pass_
    )
