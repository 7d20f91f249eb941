"""Storing the stage results an audit reports: what the kernel shaped (exception text, output, file names, evidence
keys) is cleaned first (app.core.jsonsafe). Should the database still refuse a result, it is stored again with its
status and a plain summary, so how a result is stored never changes what it says: a failure stays a failure, and
no SQL ever reaches a summary."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from app.audits import events, repository
from app.core.jsonsafe import storable_text

log = logging.getLogger(__name__)

# what the database or its driver raise for a value it cannot store (never an interrupt such as a time limit)
STORAGE_ERRORS: tuple[type[Exception], ...] = (SQLAlchemyError, UnicodeError, ValueError)
MAX_DETAIL_CHARS = 500


class StageNotStored(Exception):
    """Not even the stage's status could be stored; `status` is what the stage said."""

    def __init__(self, stage: str, status: str) -> None:
        super().__init__(f"the result of stage '{stage}' could not be stored")
        self.stage, self.status = stage, status


@dataclass(frozen=True)
class StageRecord:
    name: str
    position: int
    status: str
    summary: str
    metrics: dict[str, object]
    evidence: dict[str, object]
    duration_s: float


def internal_error_text(err: BaseException) -> str:
    """An internal error, for a summary: a database error's text names its SQL and parameters, so only its type."""
    if isinstance(err, SQLAlchemyError | StageNotStored):
        return f"{type(err).__name__} while storing the audit's results (the worker log has the details)"
    text = storable_text(f"{type(err).__name__}: {err}")
    return text if len(text) <= MAX_DETAIL_CHARS else text[: MAX_DETAIL_CHARS - 1] + "…"


def _write(
    sessions: sessionmaker[Session], audit_id: str, owner: str | None, r: StageRecord, lease_s: float, replace: bool
) -> bool:
    with sessions.begin() as s:
        ok = repository.store_stage(
            s,
            audit_id,
            owner,
            name=r.name,
            position=r.position,
            status=r.status,
            summary=r.summary,
            metrics=r.metrics,
            evidence=r.evidence,
            duration_s=r.duration_s,
            lease_s=lease_s,
            replace=replace,
        )
        if ok:
            events.stage_completed(s, audit_id, r.name, r.status, storable_text(r.summary))
    return ok


def store(
    sessions: sessionmaker[Session],
    audit_id: str,
    owner: str | None,
    record: StageRecord,
    *,
    lease_s: float,
    replace: bool = False,
) -> bool:
    """Store one stage result (and its event); False if the lease is lost. Raises StageNotStored only if the database
    refuses even the status alone."""
    try:
        return _write(sessions, audit_id, owner, record, lease_s, replace)
    except STORAGE_ERRORS as err:
        log.exception(
            "audit %s: stage %s could not be stored as reported; storing its status alone", audit_id, record.name
        )
        why = type(err).__name__
    bare = StageRecord(
        name=record.name,
        position=record.position,
        status=record.status,
        summary=f"{record.status}: this stage's details could not be stored ({why}); its status stands",
        metrics={},
        evidence={"storage_error": why},
        duration_s=record.duration_s,
    )
    try:
        return _write(sessions, audit_id, owner, bare, lease_s, replace)
    except STORAGE_ERRORS as err:
        raise StageNotStored(record.name, record.status) from err
