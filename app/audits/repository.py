"""Audit rows: create, claim a lease, heartbeat, store stage results once, finish, re-queue.
Nothing here commits: each caller owns its transaction (`sessions.begin()` or a UnitOfWork).

Every state change is a conditional UPDATE, so any number of workers and reapers can race safely."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from collections.abc import Collection

from sqlalchemy import Select, and_, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from app.audits.status import FINISHED, AuditStatus
from app.core.db import utcnow
from app.core.jsonsafe import jsonable, storable_text
from app.models import Audit, StageResultRow, Submission
from worker.report import VERDICT, StageStatus


def new_audit(
    session: Session,
    submission: Submission,
    *,
    problem_hash: str,
    attempt: int,
    reason: str,
    stages: str | None,
    device: str,
    queue: str,
) -> Audit:
    audit = Audit(
        submission=submission,
        attempt=attempt,
        status=AuditStatus.queued,
        reason=reason,
        problem_hash=problem_hash,
        seed=secrets.randbits(62),
        stages=stages,
        device=device,
        queue=queue,
        enqueued_at=utcnow(),
    )
    session.add(audit)
    return audit


def next_attempt(session: Session, submission_id: str) -> int:
    return (session.scalar(select(func.max(Audit.attempt)).where(Audit.submission_id == submission_id)) or 0) + 1


def latest_audit(session: Session, submission_id: str) -> Audit | None:
    return session.scalar(
        select(Audit).where(Audit.submission_id == submission_id).order_by(Audit.attempt.desc()).limit(1)
    )


def queue_position(session: Session, audit: Audit) -> int:
    ahead = session.scalar(
        select(func.count())
        .select_from(Audit)
        .where(Audit.status == AuditStatus.queued, Audit.queue == audit.queue, Audit.enqueued_at < audit.enqueued_at)
    )
    return int(ahead or 0) + 1


@dataclass(frozen=True)
class Claim:
    audit: Audit
    submission: Submission
    stored: dict[str, StageResultRow]


def claim(session: Session, audit_id: str, owner: str, lease_s: float) -> Claim | None:
    """Take the lease if the audit is queued or its lease expired; None if another worker has it or it is done."""
    now = utcnow()
    res = session.execute(
        update(Audit)
        .where(
            Audit.id == audit_id,
            or_(
                Audit.status == AuditStatus.queued,
                and_(Audit.status == AuditStatus.running, Audit.lease_expires_at < now),
            ),
        )
        .values(
            status=AuditStatus.running,
            lease_owner=owner,
            lease_expires_at=now + timedelta(seconds=lease_s),
            heartbeat_at=now,
            claims=Audit.claims + 1,
            started_at=func.coalesce(Audit.started_at, now),
        )
    )
    if res.rowcount != 1:
        return None
    audit = session.get(Audit, audit_id, populate_existing=True)
    assert audit is not None
    stored = {r.name: r for r in session.scalars(select(StageResultRow).where(StageResultRow.audit_id == audit_id))}
    return Claim(audit=audit, submission=audit.submission, stored=stored)


def heartbeat(session: Session, audit_id: str, owner: str, lease_s: float) -> bool:
    """Extend the lease; False if it is no longer ours (the reaper took it, or the audit finished)."""
    now = utcnow()
    res = session.execute(
        update(Audit)
        .where(Audit.id == audit_id, Audit.lease_owner == owner, Audit.status == AuditStatus.running)
        .values(heartbeat_at=now, lease_expires_at=now + timedelta(seconds=lease_s))
    )
    return res.rowcount == 1


def store_stage(
    session: Session,
    audit_id: str,
    owner: str | None,
    *,
    name: str,
    position: int,
    status: str,
    summary: str,
    metrics: dict[str, Any],
    evidence: dict[str, Any],
    duration_s: float,
    lease_s: float,
    replace: bool = False,
) -> bool:
    """Write one stage result, once per (audit, stage), only while holding the lease. False if the lease is lost.
    Its text is the kernel's to choose (exception text, output, file names): stored cleaned (app.core.jsonsafe)."""
    if owner is not None and not heartbeat(session, audit_id, owner, lease_s):
        return False
    values = dict(
        audit_id=audit_id,
        name=name,
        position=position,
        status=status,
        summary=storable_text(summary),
        metrics=jsonable(metrics),
        evidence=jsonable(evidence),
        duration_s=duration_s,
        worker=owner,
        created_at=utcnow(),
    )
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(StageResultRow).values(**values)
    if replace:
        stmt = stmt.on_conflict_do_update(
            index_elements=["audit_id", "name"], set_={k: v for k, v in values.items() if k not in ("audit_id", "name")}
        )
    else:
        stmt = stmt.on_conflict_do_nothing(index_elements=["audit_id", "name"])
    session.execute(stmt)
    return True


def finish(session: Session, audit_id: str, owner: str | None, status: str, verdict: str | None, summary: str) -> bool:
    assert status in FINISHED
    cond = [Audit.id == audit_id, Audit.status == AuditStatus.running]
    if owner is not None:
        cond.append(Audit.lease_owner == owner)
    res = session.execute(
        update(Audit)
        .where(*cond)
        .values(
            status=status,
            verdict=verdict,
            summary=storable_text(summary[:4000]),
            finished_at=utcnow(),
            lease_owner=None,
            lease_expires_at=None,
        )
    )
    return res.rowcount == 1


def requeue_expired(
    session: Session, max_claims: int, hard_limit_s: float, now: datetime | None = None
) -> tuple[list[Audit], list[str], list[str]]:
    """Running audits whose lease expired: back to queued; `timed_out` once they have run past the hard time limit
    since their first claim (Celery's hard limit kills the process, and the lease is all that is left); `error`
    after max_claims. Returns (requeued, given up, timed out)."""
    now = now or utcnow()
    expired = list(
        session.scalars(select(Audit).where(Audit.status == AuditStatus.running, Audit.lease_expires_at < now))
    )
    requeued, gave_up, timed_out = [], [], []
    for a in expired:
        lost = and_(Audit.id == a.id, Audit.status == AuditStatus.running, Audit.lease_expires_at < now)
        done = dict(finished_at=now, lease_owner=None, lease_expires_at=None)
        if a.started_at is not None and (now - a.started_at).total_seconds() >= hard_limit_s:
            res = session.execute(
                update(Audit)
                .where(lost)
                .values(
                    status="timed_out",
                    verdict="error",
                    **done,
                    summary=f"timed_out: the audit ran past its hard limit of {hard_limit_s:.0f} s",
                )
            )
            if res.rowcount == 1:
                timed_out.append(a.id)
        elif a.claims >= max_claims:
            res = session.execute(
                update(Audit)
                .where(lost)
                .values(
                    status="error",
                    verdict="error",
                    **done,
                    summary=f"error: the worker was lost {a.claims} times during this audit",
                )
            )
            if res.rowcount == 1:
                gave_up.append(a.id)
        else:
            res = session.execute(
                update(Audit)
                .where(lost)
                .values(status=AuditStatus.queued, lease_owner=None, lease_expires_at=None, enqueued_at=now)
            )
            if res.rowcount == 1:
                requeued.append(a)
    return requeued, gave_up, timed_out


def stale_queued(session: Session, queue: str, older_than: datetime) -> list[Audit]:
    return list(
        session.scalars(
            select(Audit)
            .where(
                Audit.status == AuditStatus.queued,
                Audit.queue == queue,
                or_(Audit.enqueued_at.is_(None), Audit.enqueued_at < older_than),
            )
            .order_by(Audit.enqueued_at)
        )
    )


def count_queued(session: Session, queue: str) -> int:
    return int(
        session.scalar(
            select(func.count()).select_from(Audit).where(Audit.status == AuditStatus.queued, Audit.queue == queue)
        )
        or 0
    )


def mark_enqueued(session: Session, audit_ids: list[str]) -> None:
    if audit_ids:
        session.execute(
            update(Audit)
            .where(Audit.id.in_(audit_ids), Audit.status == AuditStatus.queued)
            .values(enqueued_at=utcnow())
        )


def failed_stages(session: Session, audit_id: str) -> list[str]:
    """The audit's stored stages that failed, in the order they ran (the verdict not counted)."""
    return list(
        session.scalars(
            select(StageResultRow.name)
            .where(
                StageResultRow.audit_id == audit_id, StageResultRow.status == "failed", StageResultRow.name != VERDICT
            )
            .order_by(StageResultRow.position)
        )
    )


def stage_statuses(session: Session, audits: Collection[str] | Select[Any]) -> dict[str, dict[str, StageStatus]]:
    """Each audit's stored stage statuses, the verdict's aside, in the order the stages ran: every stage the registry
    had when the audit ran (worker.registry), read from its results rather than from a column per stage.
    `audits`: audit ids, or a select of them."""
    out: dict[str, dict[str, StageStatus]] = {}
    for audit_id, name, status in session.execute(
        select(StageResultRow.audit_id, StageResultRow.name, StageResultRow.status)
        .where(StageResultRow.audit_id.in_(audits), StageResultRow.name != VERDICT)
        .order_by(StageResultRow.audit_id, StageResultRow.position)
    ):
        out.setdefault(audit_id, {})[name] = StageStatus(status)
    return out
