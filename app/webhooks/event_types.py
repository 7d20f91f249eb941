"""The events a webhook endpoint can subscribe to, and the `data` each one carries (its payload's contract)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field

from worker.report import StageStatus


class EventType(StrEnum):
    submission_received = "submission.received"
    submission_reaudited = "submission.reaudited"
    audit_stage_completed = "audit.stage_completed"
    audit_completed = "audit.completed"
    leaderboard_rank_changed = "leaderboard.rank_changed"


class SubmissionReceived(BaseModel):
    submission_id: str
    audit_id: str
    problem: str
    solution_name: str
    submitter: str
    status_url: str


class SubmissionReaudited(BaseModel):
    submission_id: str
    audit_id: str
    attempt: int
    reason: str
    problem: str
    status_url: str


class StageCompleted(BaseModel):
    submission_id: str
    audit_id: str
    problem: str
    stage: str
    status: str
    summary: str


class AuditCompleted(BaseModel):
    submission_id: str
    audit_id: str
    problem: str
    status: str = Field(description="passed | failed | error | timed_out")
    verdict: str | None = Field(description="pass | fail | error")
    summary: str
    caught_by: str | None = Field(
        description="the first stage that failed, else the first that errored; null when none did"
    )
    failed_stages: list[str]
    passes_benchmark: bool | None = Field(description="the benchmark's own verifier; null if it did not run")
    numerically_sound: bool | None = Field(description="the probes; null if they did not run")
    stages: dict[str, StageStatus] = Field(
        default_factory=dict,
        description="every stage's status but the verdict's, in the order the stages ran (any "
        "stage registered in worker.registry)",
    )
    status_url: str


class RankChanged(BaseModel):
    problem: str
    board: str = Field(
        description="'leaderboard': the rank GET /v1/leaderboard/{problem} shows (every kernel that passes "
        "the benchmark, identical kernels folded into one entry, by speedup); 'audited': the rank "
        "among verified kernels (every run passed every stage), as ?sound_only=true shows it"
    )
    hardware: str | None = Field(
        None,
        description="the board's hardware ('cpu' or the GPU's name): ranks on different hardware are separate boards",
    )
    submission_id: str
    submitter: str
    solution_name: str
    old_rank: int | None = Field(description="null: the submission was not ranked before")
    new_rank: int | None = Field(description="null: the submission is no longer ranked")
    audit_id: str = Field(description="the audit whose completion changed the ranking")


class Envelope(BaseModel):
    """The JSON body of every delivery: Standard Webhooks' recommended shape."""

    type: EventType
    timestamp: str = Field(description="when the event happened, ISO 8601 UTC")
    data: dict[str, object]
