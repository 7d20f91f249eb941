"""The engine-to-service contract: stage names and order, each stage's result, the verdict's summary, the report.

Torch-free: the service imports it to store and show audits, the engine to produce them. Everything that names a
stage or reads a verdict goes through these types. Which stages exist, and their order, is the stage registry's
(worker.registry): a stage registered there reaches the engine, the API, the dashboard and the webhooks without
another edit.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field

from worker.registry import VERDICT, is_stage, stage_order

# the key of a stage error's evidence that names what the worker lacks to judge the kernel (a GPU of another
# generation; a GPU at all, for bf16 arithmetic in Triton): inconclusive, and a retry on the same worker would be too
WORKER_LIMIT = "worker_cannot_judge"

__all__ = [
    "VERDICT",
    "WORKER_LIMIT",
    "AuditOutcome",
    "AuditReport",
    "StageName",
    "StageResult",
    "StageStatus",
    "Verdict",
    "VerdictSummary",
    "stage_order",
    "worst_status",
]


def _registered(name: str) -> str:
    if not is_stage(name):
        raise ValueError(f"unknown stage '{name}'; the registry (worker.registry) has {', '.join(stage_order())}")
    return name


# any stage the registry holds, not a closed enum: a new stage is its package and one registry line
StageName = Annotated[str, AfterValidator(_registered)]


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


def worst_status(statuses: Iterable[StageStatus]) -> StageStatus:
    """The most severe of `statuses` (at least one), ranked as the verdict ranks stages."""
    return max(statuses, key=_SEVERITY.__getitem__)


class StageResult(BaseModel):
    name: StageName
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


class VerdictSummary(BaseModel):
    """What the verdict stage decided, as the service stores and shows it (never re-derived from stage rows)."""

    verdict: Verdict
    caught_by: list[str] = Field(
        default_factory=list, description="stages that judged the kernel wrong, deciding first"
    )
    inconclusive: list[str] = Field(default_factory=list, description="stages the auditor could not judge (errors)")
    passes_benchmark: bool | None = Field(None, description="the benchmark's own rule; None: it did not run")
    numerically_sound: bool | None = Field(None, description="kernel-audit's probes; None: they did not run")
    retry: bool = Field(False, description="an inconclusive audit: resubmitting the same files may give a verdict")

    @classmethod
    def of(cls, verdict_stage: StageResult) -> "VerdictSummary":
        m = verdict_stage.metrics
        return cls(
            verdict=Verdict(m["verdict"]),
            caught_by=list(m.get("caught_by") or []),
            inconclusive=list(m.get("inconclusive") or []),
            passes_benchmark=m.get("passes_benchmark"),
            numerically_sound=m.get("numerically_sound"),
            retry=bool(m.get("retry", False)),
        )

    @property
    def first_catch(self) -> str | None:
        return self.caught_by[0] if self.caught_by else None
