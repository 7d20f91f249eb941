"""What happens, in the same transaction, when an audit's state changes.

Each function is called inside the transaction that makes the change, so whatever it writes (webhook
outbox rows, the leaderboard's rows) commits or rolls back with the change itself: a task delivered twice
finds the audit already claimed or finished and calls nothing a second time."""

from __future__ import annotations

from sqlalchemy.orm import Session

from app.leaderboard.repository import refresh_entry
from app.models import Audit, Submission
from app.webhooks import notify as webhooks


def submission_received(session: Session, submission: Submission, audit: Audit) -> None:
    """A new submission and its first audit were written."""
    webhooks.submission_received(session, submission, audit)


def reaudited(session: Session, submission: Submission, audit: Audit) -> None:
    """A stored submission got a new audit (asked for, or its problem's checks changed)."""
    webhooks.reaudited(session, submission, audit)


def stage_completed(session: Session, audit_id: str, stage: str, status: str, summary: str) -> None:
    """A stage result was stored for the first time (the verdict included)."""
    webhooks.stage_completed(session, audit_id, stage, status, summary)


def audit_completed(session: Session, audit_id: str) -> None:
    """The audit reached a final status (by its worker, or by the reaper).

    The submission's leaderboard row is rewritten and the problem re-ranked: `refresh_entry(session, audit_id)`
    returns a `RankChange` per rank that moved (board "leaderboard" or "audited"), for `leaderboard.rank_changed`."""
    changes = refresh_entry(session, audit_id)
    webhooks.audit_completed(session, audit_id)
    webhooks.ranks_changed(session, audit_id, changes)
