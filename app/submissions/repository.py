from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from app.models import Audit, StageResultRow, Submission, SubmissionTokenStats


def by_idempotency_key(session: Session, api_key_id: str, key: str) -> Submission | None:
    return session.scalar(
        select(Submission).where(Submission.api_key_id == api_key_id, Submission.idempotency_key == key)
    )


def get(session: Session, submission_id: str) -> Submission | None:
    return session.get(Submission, submission_id)


def token_stats_of(session: Session, submission_id: str) -> SubmissionTokenStats | None:
    """The submission's token statistics row, its bytes not loaded (they load on first access to `.data`)."""
    return session.get(SubmissionTokenStats, submission_id)


def token_stats_sha256(session: Session, submission_id: str) -> str | None:
    return session.scalar(
        select(SubmissionTokenStats.sha256).where(SubmissionTokenStats.submission_id == submission_id)
    )


def audits_with_stages(session: Session, submission_id: str) -> list[tuple[Audit, list[StageResultRow]]]:
    """Every audit of the submission, oldest attempt first, each with its stored stages in order (two queries)."""
    audits = list(session.scalars(select(Audit).where(Audit.submission_id == submission_id).order_by(Audit.attempt)))
    rows: dict[str, list[StageResultRow]] = {a.id: [] for a in audits}
    if audits:
        for r in session.scalars(
            select(StageResultRow)
            .where(StageResultRow.audit_id.in_(list(rows)))
            .order_by(StageResultRow.audit_id, StageResultRow.position)
        ):
            rows[r.audit_id].append(r)
    return [(a, rows[a.id]) for a in audits]


@dataclass(frozen=True)
class PageQuery:
    """Newest first; `after` is the (created_at, id) of the last row of the previous page."""

    limit: int
    api_key_id: str | None = None  # None: every submitter's (admin)
    status: str | None = None  # of the latest audit
    problem: str | None = None
    after: tuple[datetime, str] | None = None


def page(session: Session, q: PageQuery) -> Sequence[tuple[Submission, Audit]]:
    """Up to `q.limit` submissions with their latest audit."""
    latest = (
        select(Audit.submission_id, func.max(Audit.attempt).label("attempt")).group_by(Audit.submission_id).subquery()
    )
    stmt = (
        select(Submission, Audit)
        .join(latest, latest.c.submission_id == Submission.id)
        .join(Audit, and_(Audit.submission_id == Submission.id, Audit.attempt == latest.c.attempt))
    )
    if q.api_key_id is not None:
        stmt = stmt.where(Submission.api_key_id == q.api_key_id)
    if q.status is not None:
        stmt = stmt.where(Audit.status == q.status)
    if q.problem is not None:
        stmt = stmt.where(Submission.problem_name == q.problem)
    if q.after is not None:
        at, sid = q.after
        stmt = stmt.where(or_(Submission.created_at < at, and_(Submission.created_at == at, Submission.id < sid)))
    stmt = stmt.order_by(Submission.created_at.desc(), Submission.id.desc()).limit(q.limit)
    return [(s, a) for s, a in session.execute(stmt).all()]
