"""Webhook events for each audit state change: called by app.audits.events inside the transaction of the change."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.audits.repository import stage_statuses
from app.leaderboard.repository import RankChange
from app.models import Audit, StageResultRow, Submission
from app.webhooks import outbox
from app.webhooks.event_types import (
    AuditCompleted,
    EventType,
    RankChanged,
    StageCompleted,
    SubmissionReaudited,
    SubmissionReceived,
)
from worker.report import VERDICT, StageResult, VerdictSummary


def _status_url(submission_id: str) -> str:
    return f"/v1/submissions/{submission_id}"


def submission_received(session: Session, submission: Submission, audit: Audit) -> None:
    data = SubmissionReceived(
        submission_id=submission.id,
        audit_id=audit.id,
        problem=submission.problem_name,
        solution_name=submission.solution_name,
        submitter=submission.submitter,
        status_url=_status_url(submission.id),
    )
    outbox.emit(
        session,
        EventType.submission_received,
        submission.id,
        data,
        owner_key_id=submission.api_key_id,
        audit_id=audit.id,
    )


def reaudited(session: Session, submission: Submission, audit: Audit) -> None:
    data = SubmissionReaudited(
        submission_id=submission.id,
        audit_id=audit.id,
        attempt=audit.attempt,
        reason=audit.reason,
        problem=submission.problem_name,
        status_url=_status_url(submission.id),
    )
    outbox.emit(
        session, EventType.submission_reaudited, audit.id, data, owner_key_id=submission.api_key_id, audit_id=audit.id
    )


def _audit_and_submission(session: Session, audit_id: str) -> tuple[Audit, Submission]:
    row = session.execute(
        select(Audit, Submission).join(Submission, Submission.id == Audit.submission_id).where(Audit.id == audit_id)
    ).one()
    return row[0], row[1]


def stage_completed(session: Session, audit_id: str, stage: str, status: str, summary: str) -> None:
    _audit, sub = _audit_and_submission(session, audit_id)
    data = StageCompleted(
        submission_id=sub.id, audit_id=audit_id, problem=sub.problem_name, stage=stage, status=status, summary=summary
    )
    outbox.emit(
        session,
        EventType.audit_stage_completed,
        f"{audit_id}:{stage}",
        data,
        owner_key_id=sub.api_key_id,
        audit_id=audit_id,
    )


def audit_completed(session: Session, audit_id: str) -> None:
    audit, sub = _audit_and_submission(session, audit_id)
    row = session.scalar(
        select(StageResultRow).where(StageResultRow.audit_id == audit_id, StageResultRow.name == VERDICT)
    )
    summary = _verdict_summary(row)
    data = AuditCompleted(
        submission_id=sub.id,
        audit_id=audit_id,
        problem=sub.problem_name,
        status=audit.status,
        verdict=audit.verdict,
        summary=audit.summary or "",
        caught_by=summary.first_catch if summary else None,
        failed_stages=summary.caught_by if summary else [],
        passes_benchmark=summary.passes_benchmark if summary else None,
        numerically_sound=summary.numerically_sound if summary else None,
        stages=stage_statuses(session, [audit_id]).get(audit_id, {}),
        status_url=_status_url(sub.id),
    )
    outbox.emit(session, EventType.audit_completed, audit_id, data, owner_key_id=sub.api_key_id, audit_id=audit_id)


def ranks_changed(session: Session, audit_id: str, changes: Sequence[RankChange]) -> None:
    """One leaderboard.rank_changed per (submission, board) whose rank moved, to that submission's owner (and admins)."""
    moved = [c for c in changes if c.old_rank != c.new_rank]
    if not moved:
        return
    subs = {
        s.id: s for s in session.scalars(select(Submission).where(Submission.id.in_({c.submission_id for c in moved})))
    }
    for change in moved:
        sub = subs.get(change.submission_id)
        if sub is None:
            continue
        data = RankChanged(
            problem=change.problem,
            board=change.board,
            submission_id=sub.id,
            submitter=sub.submitter,
            solution_name=sub.solution_name,
            old_rank=change.old_rank,
            new_rank=change.new_rank,
            audit_id=audit_id,
            hardware=change.hardware,
        )
        outbox.emit(
            session,
            EventType.leaderboard_rank_changed,
            f"{audit_id}:{change.board}:{sub.id}",
            data,
            owner_key_id=sub.api_key_id,
            audit_id=audit_id,
        )


def _verdict_summary(row: StageResultRow | None) -> VerdictSummary | None:
    """The verdict stage's summary (worker.report), or None when the audit stored no verdict (it broke first)."""
    if row is None or "verdict" not in (row.metrics or {}):
        return None
    return VerdictSummary.of(StageResult(name=row.name, status=row.status, summary=row.summary, metrics=row.metrics))
