"""The one shape every stage returns, and the whole report."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field


class StageStatus(StrEnum):
    passed = "passed"
    failed = "failed"
    error = "error"
    skipped = "skipped"


class Verdict(StrEnum):
    pass_ = "pass"
    fail = "fail"
    error = "error"


class AuditOutcome(StrEnum):
    """How an audit ended: the verdict, or `timed_out` when the kernel hung (the service's final audit statuses)."""

    passed = "passed"
    failed = "failed"
    error = "error"
    timed_out = "timed_out"

    @classmethod
    def of(cls, verdict: Verdict) -> AuditOutcome:
        return {Verdict.pass_: cls.passed, Verdict.fail: cls.failed, Verdict.error: cls.error}[verdict]


# a verdict is the worst stage. A failed stage is conclusive, so it outranks a stage the auditor could not judge
# (an error): otherwise a kernel that fails the probes could turn its verdict into "error" by breaking a later
# stage, and an auditor's own error (a card out of memory) would hide a failure already established.
_SEVERITY = {StageStatus.failed: 3, StageStatus.error: 2, StageStatus.passed: 1, StageStatus.skipped: 0}


class StageResult(BaseModel):
    name: str
    status: StageStatus
    summary: str = Field(description="one line a kernel author understands")
    metrics: dict[str, Any] = Field(default_factory=dict)
    evidence: dict[str, Any] = Field(default_factory=dict, description="enough to reproduce: seeds, inputs, curves")
    duration_s: float = 0.0

    @property
    def severity(self) -> int:
        return _SEVERITY[self.status]


class AuditReport(BaseModel):
    definition: str
    solution: str
    device: str
    profile: str
    verdict: Verdict
    outcome: AuditOutcome
    isolation: str | None = Field(None, description="how the submission was isolated: namespaces, or none (unisolated)")
    summary: str
    stages: list[StageResult]

    @staticmethod
    def verdict_of(stages: list[StageResult]) -> Verdict:
        worst = max((s.severity for s in stages), default=0)
        if worst >= _SEVERITY[StageStatus.failed]:
            return Verdict.fail
        if worst >= _SEVERITY[StageStatus.error]:
            return Verdict.error
        return Verdict.pass_
