from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from app.audits.status import AuditStatus
from app.core.errors import ErrorBody, FieldError
from app.submissions.token_stats import TokenStatsView
from worker.traces import Trace

# the documented 4xx shape; kept under the names the submission routes have always used
InvalidSolution = ErrorBody
SEED_DOC = (
    "the audit's secret seed as a decimal string (62 bits: JSON numbers lose digits), shown once the audit has finished"
)


class SubmissionAccepted(BaseModel):
    id: str
    audit_id: str
    status: AuditStatus
    status_url: str
    queue_position: int | None = Field(description="1 = next to run; null when no longer queued")
    idempotent_replay: bool = Field(default=False, description="true if this Idempotency-Key was seen before")


class StageOut(BaseModel):
    name: str
    status: str
    summary: str
    metrics: dict[str, Any] = Field(description="integers beyond 2**53 (seeds) are decimal strings")
    evidence: dict[str, Any] = Field(description="integers beyond 2**53 (seeds) are decimal strings")
    duration_s: float
    finished_at: datetime


class Progress(BaseModel):
    """Where a running audit is: the stage it is in, and how long it has been there."""

    current_stage: str | None = Field(description="the first stage with no stored result; null once all are stored")
    current_stage_elapsed_s: float | None = Field(
        description="seconds since the previous stage finished (or the audit started)"
    )
    elapsed_s: float = Field(description="seconds since the audit started")
    stages_done: int
    stages_total: int


class AuditView(BaseModel):
    """One audit of a submission: its status, result, seed (once finished), stages and, while running, progress."""

    audit_id: str
    attempt: int
    status: AuditStatus
    reason: str
    started_at: datetime | None
    finished_at: datetime | None
    verdict: str | None
    summary: str | None
    seed: str | None = Field(description=SEED_DOC)
    progress: Progress | None = Field(description="while running: the current stage and elapsed times")
    stages: list[StageOut]


class Attempt(AuditView):
    device: str
    enqueued_at: datetime | None


class SubmissionStatus(AuditView):
    """The latest attempt's fields at top level (what single-attempt clients read), and every attempt, oldest first, in `attempts`."""

    id: str
    problem: str
    solution_name: str
    submitter: str
    source_hash: str
    created_at: datetime
    attempts: list[Attempt] = Field(
        description="every audit of this submission, oldest first: a re-audit keeps the earlier results"
    )
    token_stats: TokenStatsView | None = Field(
        default=None,
        description="the token statistics sent with the submission (null: the built-in text); every audit "
        "of it draws its id probes and canary text from them",
    )


class SubmissionSummary(BaseModel):
    id: str
    problem: str
    solution_name: str
    submitter: str
    created_at: datetime
    audit_id: str
    attempt: int
    status: AuditStatus
    verdict: str | None
    finished_at: datetime | None
    status_url: str


class SubmissionPage(BaseModel):
    items: list[SubmissionSummary]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null on the last page")


__all__ = [
    "Attempt",
    "AuditView",
    "FieldError",
    "InvalidSolution",
    "Progress",
    "StageOut",
    "SubmissionAccepted",
    "SubmissionPage",
    "SubmissionStatus",
    "SubmissionSummary",
]


class SubmissionTraces(BaseModel):
    """The latest audit's SOL-ExecBench traces (worker.traces.Trace, the official schema)."""

    submission: str
    audit: str
    status: str = Field(description="the audit's status; traces appear once it has finished")
    traces: list[Trace]
