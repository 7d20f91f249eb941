"""The submission page as its viewer may see it (the rule: app/submissions/disclosure.py): the owner's key and
admins see the page as queried; anyone else sees statuses, numbers, plots and diagnoses, and no text the
submission produced or the audit quoted from it."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.auth.principal import Principal
from app.dashboard.queries import EVIDENCE_CHARS, StageView, SubmissionView
from app.models import Audit, StageResultRow, Submission
from app.submissions.disclosure import (
    Disclosure,
    disclosure,
    public_audit_summary,
    public_numbers,
)


class Shown(BaseModel):
    view: SubmissionView
    private_hidden: bool


def _stage_metrics(session: Session, submission_id: str, attempt: int) -> dict[str, Any]:
    rows = session.execute(
        select(StageResultRow.name, StageResultRow.metrics)
        .join(Audit, Audit.id == StageResultRow.audit_id)
        .where(Audit.submission_id == submission_id, Audit.attempt == attempt)
    ).all()
    return {name: metrics for name, metrics in rows}


def _numbers_json(metrics: Any) -> str | None:
    numbers = public_numbers(metrics)
    if numbers is None:
        return None
    text = json.dumps({"metrics": numbers}, indent=1, sort_keys=True)
    return text if len(text) <= EVIDENCE_CHARS else text[:EVIDENCE_CHARS] + "\n... (truncated)"


def _public_stage(stage: StageView, metrics: Any, finished: bool) -> StageView:
    # no summary (it quotes the submission); numbers only once the audit has finished, as the full page's evidence
    return stage.model_copy(update={"summary": "", "evidence_json": _numbers_json(metrics) if finished else None})


def for_viewer(session: Session, view: SubmissionView, who: Principal | None) -> Shown:
    owner = session.scalar(select(Submission.api_key_id).where(Submission.id == view.id))
    if disclosure(who, owner) is Disclosure.full:
        return Shown(view=view, private_hidden=False)
    metrics = _stage_metrics(session, view.id, view.attempt)
    stages = [_public_stage(st, metrics.get(st.name), view.finished) for st in view.stages]
    summary = public_audit_summary(view.verdict, [(st.name, st.status) for st in view.stages])
    return Shown(view=view.model_copy(update={"stages": stages, "summary": summary}), private_hidden=True)
