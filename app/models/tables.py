"""SQLAlchemy 2.0 models: the database is the source of truth for every submission and audit."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    true,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.audits.status import AuditStatus
from app.core.db import utcnow
from app.models.base import Base, new_id

AUDIT_STATUSES = tuple(AuditStatus)


class Problem(Base):
    __tablename__ = "problems"
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    description: Mapped[str] = mapped_column(Text, default="")
    content_hash: Mapped[str] = mapped_column(String(64))
    definition: Mapped[dict[str, Any]] = mapped_column(JSON)
    probes: Mapped[list[str]] = mapped_column(JSON, default=list)
    synced_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    origin: Mapped[str] = mapped_column(
        String(16),
        default="catalogue",
        server_default="catalogue",
        doc="catalogue (a folder under kernels/) or uploaded (POST /v1/definitions)",
    )
    bundle: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True, doc="uploaded: definition and workloads")
    uploaded_by: Mapped[str | None] = mapped_column(ForeignKey("api_keys.id"), nullable=True)
    # `name` is the problem's address. A catalogue problem's is its definition's name; an upload's is
    # '<definition name>@<namespace>' (app.problems.namespaces), so an upload never takes a catalogue name
    namespace: Mapped[str] = mapped_column(
        String(32),
        default="catalogue",
        server_default="catalogue",
        doc="catalogue, or the uploading API key's namespace",
    )
    public: Mapped[bool] = mapped_column(
        Boolean,
        default=True,
        server_default=true(),
        doc="false: an upload only its owner and admins see, until an admin publishes it",
    )
    deleted_at: Mapped[datetime | None] = mapped_column(
        DateTime, nullable=True, doc="deleted by its owner or an admin; kept for its submissions"
    )


class ApiKey(Base):
    __tablename__ = "api_keys"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    submitter: Mapped[str] = mapped_column(String(200), index=True)
    prefix: Mapped[str] = mapped_column(String(16), doc="first characters of the key, for people to tell keys apart")
    key_hash: Mapped[str] = mapped_column(
        String(64), unique=True, doc="sha256 of the key; the key itself is never stored"
    )
    scopes: Mapped[str] = mapped_column(String(200), default="submit")
    rate_limit: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)


class Submission(Base):
    __tablename__ = "submissions"
    __table_args__ = (
        UniqueConstraint("api_key_id", "idempotency_key"),
        Index("ix_submissions_problem_created", "problem_name", "created_at"),
    )
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    problem_name: Mapped[str] = mapped_column(ForeignKey("problems.name"))
    api_key_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id"), index=True)
    submitter: Mapped[str] = mapped_column(String(200))
    solution_name: Mapped[str] = mapped_column(String(200))
    source: Mapped[dict[str, Any]] = mapped_column(JSON, doc="the solution.json as submitted")
    source_hash: Mapped[str] = mapped_column(String(64), index=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    audits: Mapped[list[Audit]] = relationship(back_populates="submission", order_by="Audit.attempt")


class SubmissionTokenStats(Base):
    """A submitter's token statistics (bring your own distribution), sent with the submission and validated at POST;
    every audit of the submission (re-audits too) draws its id probes and canary text from them."""

    __tablename__ = "submission_token_stats"
    submission_id: Mapped[str] = mapped_column(ForeignKey("submissions.id"), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), doc="histogram or sample, as the reader resolved it")
    requested_kind: Mapped[str] = mapped_column(String(16), doc="auto, histogram or sample, as sent")
    format: Mapped[str] = mapped_column(String(16), doc="npy or safetensors")
    key: Mapped[str | None] = mapped_column(String(200), nullable=True, doc="safetensors: the tensor used")
    entries: Mapped[int] = mapped_column(Integer, doc="bins of a histogram, ids of a sample")
    size_bytes: Mapped[int] = mapped_column(Integer, doc="of the file as sent (decoded)")
    sha256: Mapped[str] = mapped_column(String(64), doc="of the file as sent (decoded)")
    data: Mapped[bytes] = mapped_column(LargeBinary, deferred=True, doc="the file's bytes; loaded only by the worker")
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class Audit(Base):
    __tablename__ = "audits"
    __table_args__ = (
        UniqueConstraint("submission_id", "attempt"),
        Index("ix_audits_status_enqueued", "status", "enqueued_at"),
    )
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    submission_id: Mapped[str] = mapped_column(ForeignKey("submissions.id"), index=True)
    attempt: Mapped[int] = mapped_column(Integer, default=1, doc="1 for the first audit, +1 per re-audit")
    status: Mapped[str] = mapped_column(String(16), default=AuditStatus.queued)
    reason: Mapped[str] = mapped_column(String(200), default="submitted")
    problem_hash: Mapped[str] = mapped_column(String(64))
    seed: Mapped[int] = mapped_column(
        BigInteger, doc="secret: inputs are drawn from it; never shown before the audit ends"
    )
    stages: Mapped[str | None] = mapped_column(String(200), nullable=True)
    device: Mapped[str] = mapped_column(String(32), default="cpu")
    queue: Mapped[str] = mapped_column(String(64), default="cpu")
    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    claims: Mapped[int] = mapped_column(Integer, default=0, doc="how many times a worker took the lease")
    lease_owner: Mapped[str | None] = mapped_column(String(200), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    verdict: Mapped[str | None] = mapped_column(String(16), nullable=True)
    summary: Mapped[str | None] = mapped_column(Text, nullable=True)
    submission: Mapped[Submission] = relationship(back_populates="audits")
    stage_results: Mapped[list[StageResultRow]] = relationship(order_by="StageResultRow.position")


class StageResultRow(Base):
    __tablename__ = "stage_results"
    __table_args__ = (UniqueConstraint("audit_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    audit_id: Mapped[str] = mapped_column(ForeignKey("audits.id"), index=True)
    name: Mapped[str] = mapped_column(String(32))
    position: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    summary: Mapped[str] = mapped_column(Text)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    duration_s: Mapped[float] = mapped_column(Float, default=0.0)
    worker: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class WebhookEndpoint(Base):
    __tablename__ = "webhook_endpoints"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    api_key_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id"), index=True)
    url: Mapped[str] = mapped_column(String(2000))
    secret: Mapped[str] = mapped_column(String(128), doc="HMAC key for the signature header")
    events: Mapped[list[str]] = mapped_column(JSON, default=list)
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    consecutive_failures: Mapped[int] = mapped_column(Integer, default=0, doc="failed attempts since the last success")
    disabled_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    disabled_reason: Mapped[str | None] = mapped_column(String(500), nullable=True)


class WebhookDelivery(Base):
    """The outbox: one row per (event, endpoint), written in the transaction that made the event happen."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        UniqueConstraint("event_id", "endpoint_id"),
        Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
    )
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    endpoint_id: Mapped[str] = mapped_column(ForeignKey("webhook_endpoints.id"), index=True)
    event_id: Mapped[str] = mapped_column(
        String(64), doc="the webhook-id header: the same for every endpoint and attempt"
    )
    audit_id: Mapped[str | None] = mapped_column(ForeignKey("audits.id"), index=True, nullable=True)
    event: Mapped[str] = mapped_column(String(64))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    locked_until: Mapped[datetime | None] = mapped_column(
        DateTime, nullable=True, doc="sent to the queue; re-sent after this"
    )
    dispatch_token: Mapped[str | None] = mapped_column(
        String(32), nullable=True, doc="the one task message allowed to attempt it"
    )
    last_response_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class WebhookAttempt(Base):
    """The delivery log: one row per HTTP attempt."""

    __tablename__ = "webhook_attempts"
    __table_args__ = (
        UniqueConstraint("delivery_id", "attempt"),
        Index("ix_webhook_attempts_endpoint_started", "endpoint_id", "started_at"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    delivery_id: Mapped[str] = mapped_column(ForeignKey("webhook_deliveries.id"), index=True)
    endpoint_id: Mapped[str] = mapped_column(ForeignKey("webhook_endpoints.id"))
    attempt: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(DateTime)
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    latency_ms: Mapped[float] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    outcome: Mapped[str] = mapped_column(String(16), doc="this attempt's own result: delivered (a 2xx) or failed")
    retry_at: Mapped[datetime | None] = mapped_column(
        DateTime,
        nullable=True,
        doc="failed: when the backoff scheduled the next attempt; null when none was (delivered, out of attempts, or disabled)",
    )


class LeaderboardEntry(Base):
    """One row per submission: its latest finished audit as the leaderboard and the dashboard show it. Written by
    app.leaderboard.repository.refresh_entry in the transaction that finishes the audit; read, never computed, by GETs."""

    __tablename__ = "leaderboard_entries"
    __table_args__ = (
        Index("ix_leaderboard_entries_problem_rank", "problem_name", "rank"),
        Index("ix_leaderboard_entries_problem_sound_rank", "problem_name", "sound_rank"),
        Index("ix_leaderboard_entries_problem_benchmark_rank", "problem_name", "benchmark_rank"),
    )
    submission_id: Mapped[str] = mapped_column(ForeignKey("submissions.id"), primary_key=True)
    audit_id: Mapped[str] = mapped_column(ForeignKey("audits.id"))
    attempt: Mapped[int] = mapped_column(Integer)
    problem_name: Mapped[str] = mapped_column(ForeignKey("problems.name"))
    submitter: Mapped[str] = mapped_column(String(200))
    solution_name: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), doc="the audit's final status")
    verdict: Mapped[str | None] = mapped_column(String(16), nullable=True)
    caught_by: Mapped[str | None] = mapped_column(
        String(32), nullable=True, doc="the first stage that failed, else the first that errored"
    )
    kernel_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    reference_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    speedup: Mapped[float | None] = mapped_column(Float, nullable=True)
    passes_benchmark: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    numerically_sound: Mapped[bool | None] = mapped_column(Boolean, nullable=True, doc="None: the probes did not run")
    # no column per stage: each stage's status is read from the audit's stage_results (app.audits.repository.stage_statuses),
    # so a stage added to the registry (worker.registry) needs no migration
    # ranks come from app.leaderboard.ranking, on the run's board (problem, hardware); a folded run has none
    rank: Mapped[int | None] = mapped_column(
        Integer, nullable=True, doc="GET /v1/leaderboard: the benchmark board's rank"
    )
    sound_rank: Mapped[int | None] = mapped_column(
        Integer, nullable=True, doc="GET /v1/leaderboard?sound_only: the audited board's"
    )
    benchmark_rank: Mapped[int | None] = mapped_column(Integer, nullable=True, doc="the dashboard's: the same as rank")
    audited_rank: Mapped[int | None] = mapped_column(
        Integer, nullable=True, doc="the dashboard's: the same as sound_rank"
    )
    kernel_hash: Mapped[str | None] = mapped_column(String(64), nullable=True, doc="sources + entry point + languages")
    hardware: Mapped[str | None] = mapped_column(String(200), nullable=True, doc="cpu, or the GPU's name: the board")
    speedup_lo: Mapped[float | None] = mapped_column(Float, nullable=True, doc="the run's speedup interval")
    speedup_hi: Mapped[float | None] = mapped_column(Float, nullable=True)
    indicative: Mapped[bool | None] = mapped_column(Boolean, nullable=True, doc="CPU figures: indicative only")
    folded_into: Mapped[str | None] = mapped_column(
        String(32), nullable=True, doc="the entry (submission) this identical run is shown in"
    )
    runs: Mapped[int | None] = mapped_column(
        Integer, nullable=True, doc="an entry: how many identical runs it folds in"
    )
    position: Mapped[int | None] = mapped_column(
        Integer, nullable=True, doc="order on the benchmark board (ties share a rank)"
    )
    sound_position: Mapped[int | None] = mapped_column(Integer, nullable=True, doc="order on the audited board")
    finished_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    row_json: Mapped[str | None] = mapped_column(
        Text, nullable=True, doc="this row of GET /v1/leaderboard, serialised (rank)"
    )
    sound_row_json: Mapped[str | None] = mapped_column(
        Text, nullable=True, doc="the same with sound_only=true (sound_rank)"
    )
