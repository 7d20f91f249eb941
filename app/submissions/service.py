"""Accept a submission: one transaction writes the submission and its queued audit; the broker hears of it after."""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.audits import repository as audits
from app.audits.queue import AuditQueue
from app.auth.dependencies import Principal
from app.core.db import utcnow
from app.core.settings import Settings
from app.models import Audit, Submission, new_id
from app.submissions import repository
from app.submissions.schemas import StageOut, SubmissionStatus

_SUBMISSIONS, _AUDITS = Submission.__table__, Audit.__table__
# built once, compiled once per dialect (SQLAlchemy caches the compiled form)
_INSERT_SUBMISSION = insert(_SUBMISSIONS)
_INSERT_AUDIT = insert(_AUDITS)
_QUEUED_AHEAD = select(func.count()).select_from(_AUDITS).where(
    _AUDITS.c.status == "queued", _AUDITS.c.queue == bindparam("queue"), _AUDITS.c.enqueued_at < bindparam("now"))
_SUB_COLS = ("id", "problem_name", "api_key_id", "submitter", "solution_name", "source", "source_hash", "idempotency_key", "created_at")
_AUDIT_COLS = ("id", "submission_id", "attempt", "status", "reason", "problem_hash", "seed", "stages", "device", "queue",
               "enqueued_at", "claims", "created_at")
_PG_SUBMIT = (
    f"WITH s AS (INSERT INTO submissions ({', '.join(_SUB_COLS)}) "
    f"VALUES ({', '.join(f'%(s_{c})s' + ('::json' if c == 'source' else '') for c in _SUB_COLS)})) "
    f"INSERT INTO audits ({', '.join(_AUDIT_COLS)}) VALUES ({', '.join(f'%(a_{c})s' for c in _AUDIT_COLS)}) "
    "RETURNING (SELECT count(*) FROM audits WHERE status = 'queued' AND queue = %(a_queue)s AND enqueued_at < %(a_enqueued_at)s)"
)


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


def _replay(session: Session, existing: Submission, digest: str) -> Accepted:
    if existing.source_hash != digest:
        raise IdempotencyConflict("this Idempotency-Key was used for a different body")
    audit = audits.latest_audit(session, existing.id)
    assert audit is not None
    pos = audits.queue_position(session, audit) if audit.status == "queued" else None
    return Accepted(existing.id, audit.id, audit.status, True, pos)


def submit(session: Session, queue: AuditQueue, settings: Settings, principal: Principal, *, problem_name: str, problem_hash: str,
           solution_name: str, data: dict[str, Any], idempotency_key: str | None, device: str | None = None) -> Accepted:
    device = device or settings.device
    queue_name = settings.queue_for(device)
    digest = source_hash(data)
    if idempotency_key:
        existing = repository.by_idempotency_key(session, principal.key_id, idempotency_key)
        if existing is not None:
            return _replay(session, existing, digest)
    # Core statements on the session's connection, not the ORM unit of work: this is the hot path of the API
    sub_id, audit_id, now = new_id(), new_id(), utcnow()
    try:
        conn = session.connection()
        sub_row = dict(id=sub_id, problem_name=problem_name, api_key_id=principal.key_id, submitter=principal.submitter,
                       solution_name=solution_name, source=data, source_hash=digest, idempotency_key=idempotency_key, created_at=now)
        audit_row = dict(id=audit_id, submission_id=sub_id, attempt=1, status="queued", reason="submitted", problem_hash=problem_hash,
                         seed=secrets.randbits(62), stages=settings.audit_stages, device=device, queue=queue_name,
                         enqueued_at=now, claims=0, created_at=now)
        if conn.dialect.name == "postgresql":  # one round trip: both rows and the queue position
            ahead = conn.exec_driver_sql(_PG_SUBMIT, {**{f"s_{k}": v for k, v in sub_row.items()}, "s_source": json.dumps(data),
                                                      **{f"a_{k}": v for k, v in audit_row.items()}}).scalar()
        else:
            conn.execute(_INSERT_SUBMISSION, sub_row)
            conn.execute(_INSERT_AUDIT, audit_row)
            ahead = conn.execute(_QUEUED_AHEAD, dict(queue=queue_name, now=now)).scalar()
        session.commit()
    except IntegrityError:
        session.rollback()
        existing = repository.by_idempotency_key(session, principal.key_id, idempotency_key) if idempotency_key else None
        if existing is None:
            raise
        return _replay(session, existing, digest)
    queue.send(audit_id, queue_name)  # after the commit: a worker never sees an audit that is not in the database
    return Accepted(sub_id, audit_id, "queued", False, int(ahead or 0) + 1)


def reaudit(session: Session, queue: AuditQueue, settings: Settings, sub: Submission, problem_hash: str) -> Accepted:
    from app.problems.service import reaudit as new_reaudit

    audit = new_reaudit(session, sub, problem_hash, settings, reason="re-audit requested")
    session.flush()
    position = audits.queue_position(session, audit)
    session.commit()
    queue.send(audit.id, audit.queue)
    return Accepted(sub.id, audit.id, audit.status, False, position)


def status(session: Session, sub: Submission) -> SubmissionStatus:
    audit = audits.latest_audit(session, sub.id)
    assert audit is not None
    rows = repository.stages_of(session, audit)
    done = audit.status in ("passed", "failed", "error", "timed_out")
    return SubmissionStatus(
        id=sub.id, problem=sub.problem_name, solution_name=sub.solution_name, submitter=sub.submitter, source_hash=sub.source_hash,
        created_at=sub.created_at, audit_id=audit.id, attempt=audit.attempt, status=audit.status, reason=audit.reason,  # type: ignore[arg-type]
        started_at=audit.started_at, finished_at=audit.finished_at, verdict=audit.verdict, summary=audit.summary,
        seed=audit.seed if done else None,
        stages=[StageOut(name=r.name, status=r.status, summary=r.summary, metrics=r.metrics, evidence=r.evidence,
                         duration_s=r.duration_s, finished_at=r.created_at) for r in rows],
    )
