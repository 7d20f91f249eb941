"""Rows -> the submission's API view: every attempt with its stages, a running audit's progress, JSON-safe numbers."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from app.audits.status import FINISHED, AuditStatus
from app.models import Audit, StageResultRow
from app.submissions.schemas import Attempt, Progress, StageOut
from worker.report import stage_order

# integers beyond this lose digits in JavaScript and jq (IEEE doubles)
MAX_SAFE_INT = 2**53 - 1


def js_safe(value: Any) -> Any:
    """Integers a double cannot hold exactly (62-bit seeds) become decimal strings; everything else is unchanged."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return str(value) if abs(value) > MAX_SAFE_INT else value
    if isinstance(value, dict):
        return {k: js_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [js_safe(v) for v in value]
    return value


def progress(audit: Audit, rows: Sequence[StageResultRow], now: datetime) -> Progress | None:
    """A running audit's current stage (the first with no stored result) and elapsed times; None otherwise."""
    if audit.status != AuditStatus.running or audit.started_at is None:
        return None
    stored = {r.name for r in rows}
    order = stage_order()
    current = next((name for name in order if name not in stored), None)
    since = max((r.created_at for r in rows), default=audit.started_at)
    return Progress(
        current_stage=current,
        current_stage_elapsed_s=round(max(0.0, (now - since).total_seconds()), 3) if current else None,
        elapsed_s=round(max(0.0, (now - audit.started_at).total_seconds()), 3),
        stages_done=len(stored),
        stages_total=len(order),
    )


def stage_out(row: StageResultRow) -> StageOut:
    return StageOut(
        name=row.name,
        status=row.status,
        summary=row.summary,
        metrics=js_safe(row.metrics),
        evidence=js_safe(row.evidence),
        duration_s=row.duration_s,
        finished_at=row.created_at,
    )


def attempt_out(audit: Audit, rows: Sequence[StageResultRow], now: datetime) -> Attempt:
    done = audit.status in FINISHED
    return Attempt(
        audit_id=audit.id,
        attempt=audit.attempt,
        status=AuditStatus(audit.status),
        reason=audit.reason,
        device=audit.device,
        enqueued_at=audit.enqueued_at,
        started_at=audit.started_at,
        finished_at=audit.finished_at,
        verdict=audit.verdict,
        summary=audit.summary,
        seed=str(audit.seed) if done else None,
        progress=progress(audit, rows, now),
        stages=[stage_out(r) for r in rows],
    )
