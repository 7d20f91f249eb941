"""Accept a submission: one transaction writes the submission and its queued audit; the broker hears of it after."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.audits import events
from app.audits import repository as audits
from app.audits.status import AuditStatus
from app.auth.principal import Principal
from app.core.db import utcnow
from app.core.settings import Settings
from app.core.unit_of_work import UnitOfWork
from app.models import Submission, SubmissionTokenStats
from app.problems.service import reaudit as new_reaudit
from app.submissions import repository
from app.submissions.cursor import decode as decode_cursor
from app.submissions.cursor import encode as encode_cursor
from app.submissions.schemas import (
    AuditView,
    SubmissionPage,
    SubmissionStatus,
    SubmissionSummary,
    SubmissionTraces,
)
from app.submissions.token_stats import AcceptedTokenStats
from app.submissions.token_stats import view as token_stats_view
from app.submissions.views import attempt_out
from worker.traces import Trace


class IdempotencyConflict(Exception):
    pass


@dataclass(frozen=True)
class Accepted:
    submission_id: str
    audit_id: str
    status: str
    replay: bool
    queue_position: int | None


def source_hash(data: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _replay(session: Session, existing: Submission, digest: str, stats_sha256: str | None) -> Accepted:
    if existing.source_hash != digest or repository.token_stats_sha256(session, existing.id) != stats_sha256:
        raise IdempotencyConflict("this Idempotency-Key was used for a different body")
    audit = audits.latest_audit(session, existing.id)
    assert audit is not None
    pos = audits.queue_position(session, audit) if audit.status == AuditStatus.queued else None
    return Accepted(existing.id, audit.id, audit.status, True, pos)


def submit(
    uow: UnitOfWork,
    settings: Settings,
    principal: Principal,
    *,
    problem_name: str,
    problem_hash: str,
    solution_name: str,
    data: dict[str, Any],
    idempotency_key: str | None,
    device: str | None = None,
    token_stats: AcceptedTokenStats | None = None,
) -> Accepted:
    """Write the submission (with its token statistics, if any) and its queued audit; the audit is sent to its
    queue when `uow` commits."""
    session = uow.session
    device = device or settings.device
    digest = source_hash(data)
    stats_sha256 = token_stats.sha256 if token_stats is not None else None
    if idempotency_key:
        existing = repository.by_idempotency_key(session, principal.key_id, idempotency_key)
        if existing is not None:
            return _replay(session, existing, digest, stats_sha256)
    sub = Submission(
        problem_name=problem_name,
        api_key_id=principal.key_id,
        submitter=principal.submitter,
        solution_name=solution_name,
        source=data,
        source_hash=digest,
        idempotency_key=idempotency_key,
    )
    session.add(sub)
    audit = audits.new_audit(
        session,
        sub,
        problem_hash=problem_hash,
        attempt=1,
        reason="submitted",
        stages=settings.audit_stages,
        device=device,
        queue=settings.queue_for(device),
    )
    try:
        session.flush()  # a concurrent twin with the same Idempotency-Key loses here, not at commit
    except IntegrityError:
        session.rollback()  # this request wrote nothing else
        existing = (
            repository.by_idempotency_key(session, principal.key_id, idempotency_key) if idempotency_key else None
        )
        if existing is None:
            raise
        return _replay(session, existing, digest, stats_sha256)
    if token_stats is not None:
        session.add(
            SubmissionTokenStats(
                submission_id=sub.id,
                kind=token_stats.kind,
                requested_kind=token_stats.requested_kind,
                format=token_stats.format,
                key=token_stats.key,
                entries=token_stats.entries,
                size_bytes=token_stats.size_bytes,
                sha256=token_stats.sha256,
                data=token_stats.data,
            )
        )
    events.submission_received(session, sub, audit)
    uow.enqueue(audit)
    return Accepted(sub.id, audit.id, audit.status, False, audits.queue_position(session, audit))


def reaudit(uow: UnitOfWork, settings: Settings, sub: Submission, problem_hash: str) -> Accepted:
    audit = new_reaudit(uow.session, sub, problem_hash, settings, reason="re-audit requested")
    uow.session.flush()
    uow.enqueue(audit)
    return Accepted(sub.id, audit.id, audit.status, False, audits.queue_position(uow.session, audit))


def status(session: Session, sub: Submission) -> SubmissionStatus:
    """The latest attempt at top level, and every attempt (with its stages and, while running, its progress)."""
    now = utcnow()
    attempts = [attempt_out(a, rows, now) for a, rows in repository.audits_with_stages(session, sub.id)]
    latest = attempts[-1]
    stats = repository.token_stats_of(session, sub.id)
    return SubmissionStatus(
        id=sub.id,
        problem=sub.problem_name,
        solution_name=sub.solution_name,
        submitter=sub.submitter,
        source_hash=sub.source_hash,
        created_at=sub.created_at,
        attempts=attempts,
        **latest.model_dump(include=set(AuditView.model_fields)),
        token_stats=None
        if stats is None
        else token_stats_view(
            stats.format, stats.requested_kind, stats.kind, stats.key, stats.entries, stats.size_bytes, stats.sha256
        ),
    )


def list_submissions(
    session: Session,
    principal: Principal,
    *,
    limit: int,
    status: AuditStatus | None = None,
    problem: str | None = None,
    cursor: str | None = None,
) -> SubmissionPage:
    """The caller's submissions (an admin's: everyone's), newest first, with their latest audit. Raises BadCursor."""
    q = repository.PageQuery(
        limit=limit + 1,
        api_key_id=None if principal.is_admin else principal.key_id,
        status=status.value if status else None,
        problem=problem,
        after=decode_cursor(cursor) if cursor else None,
    )
    rows = repository.page(session, q)
    items = [
        SubmissionSummary(
            id=s.id,
            problem=s.problem_name,
            solution_name=s.solution_name,
            submitter=s.submitter,
            created_at=s.created_at,
            audit_id=a.id,
            attempt=a.attempt,
            status=AuditStatus(a.status),
            verdict=a.verdict,
            finished_at=a.finished_at,
            status_url=f"/v1/submissions/{s.id}",
        )
        for s, a in rows[:limit]
    ]
    more = len(rows) > limit
    return SubmissionPage(items=items, next_cursor=encode_cursor(items[-1].created_at, items[-1].id) if more else None)


def traces(session: Session, sub: Submission) -> SubmissionTraces:
    """The traces the worker kept with the latest audit's verdict (worker.engine); none before it has one."""
    audit, rows = repository.audits_with_stages(session, sub.id)[-1]
    verdict = next((r for r in rows if r.name == "verdict"), None)
    raw = (verdict.evidence or {}).get("traces", []) if verdict is not None else []
    return SubmissionTraces(
        submission=sub.id, audit=audit.id, status=audit.status, traces=[Trace.model_validate(t) for t in raw]
    )
