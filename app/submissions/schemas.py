from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from app.audits.status import AuditStatus


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
    metrics: dict[str, Any]
    evidence: dict[str, Any]
    duration_s: float
    finished_at: datetime


class SubmissionStatus(BaseModel):
    id: str
    problem: str
    solution_name: str
    submitter: str
    source_hash: str
    created_at: datetime
    audit_id: str
    attempt: int
    status: AuditStatus
    reason: str
    started_at: datetime | None
    finished_at: datetime | None
    verdict: str | None
    summary: str | None
    seed: int | None = Field(description="the audit's secret seed, shown once the audit has finished")
    stages: list[StageOut]


class FieldError(BaseModel):
    field: str
    reason: str


class InvalidSolution(BaseModel):
    detail: str
    errors: list[FieldError]
