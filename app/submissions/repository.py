from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.models import Audit, StageResultRow, Submission


def by_idempotency_key(session: Session, api_key_id: str, key: str) -> Submission | None:
    return session.scalar(select(Submission).where(Submission.api_key_id == api_key_id, Submission.idempotency_key == key))


def get(session: Session, submission_id: str) -> Submission | None:
    return session.get(Submission, submission_id)


def stages_of(session: Session, audit: Audit) -> list[StageResultRow]:
    return list(session.scalars(select(StageResultRow).where(StageResultRow.audit_id == audit.id).order_by(StageResultRow.position)))
