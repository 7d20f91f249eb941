"""What the dashboard's pages show, read from the database into pydantic models (no API key ever leaves here:
the models carry submitter names, never keys)."""

from __future__ import annotations

import json
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel
from sqlalchemy import and_, case, func, select
from sqlalchemy.orm import Session

from app.audits import repository as audits
from app.audits.status import FINISHED, AuditStatus
from app.dashboard import plots
from app.leaderboard.repository import STAGES, passes_every_stage
from app.models import Audit, LeaderboardEntry, Problem, StageResultRow, Submission

E = LeaderboardEntry
EVIDENCE_CHARS = 20_000
ACTIVE = (AuditStatus.queued, AuditStatus.running)


class ProblemSummary(BaseModel):
    name: str
    description: str
    submissions: int
    in_progress: int
    passed_benchmark: int
    caught: int = 0


class RowFilter(StrEnum):
    """The leaderboard page's status filter."""

    all = "all"
    audited = "audited"  # passes every stage
    caught = "caught"  # passes the benchmark, fails an audit stage
    failed_benchmark = "failed_benchmark"
    error = "error"  # the audit ended in error or timed out


class BoardRow(BaseModel):
    submission_id: str
    submitter: str
    solution_name: str
    kernel_ms: float | None
    speedup: float | None
    passes_benchmark: bool | None
    status: str
    verdict: str | None
    caught_by: str | None
    stages: dict[str, str | None]
    benchmark_rank: int | None
    audited_rank: int | None
    audited: bool
    caught: bool
    finished_at: datetime | None


class InProgress(BaseModel):
    submission_id: str
    submitter: str
    solution_name: str
    status: str


class StageView(BaseModel):
    name: str
    status: str
    summary: str
    diagnosis: list[str]
    duration_s: float
    evidence_json: str | None  # None while the audit runs: evidence can name derived seeds
    plots: list[dict[str, Any]]


class SubmissionView(BaseModel):
    id: str
    problem: str
    submitter: str
    solution_name: str
    created_at: datetime
    attempt: int
    status: str
    finished: bool
    verdict: str | None
    summary: str | None
    stages: list[StageView]
    benchmark_rank: int | None
    audited_rank: int | None


def problems(session: Session) -> list[ProblemSummary]:
    counts = dict(session.execute(select(Submission.problem_name, func.count()).group_by(Submission.problem_name)).all())
    active = dict(session.execute(
        select(Submission.problem_name, func.count()).join(Audit, Audit.submission_id == Submission.id)
        .where(Audit.status.in_(ACTIVE)).group_by(Submission.problem_name)).all())
    passing = E.passes_benchmark.is_(True)
    board = {r[0]: (int(r[1] or 0), int(r[2] or 0)) for r in session.execute(
        select(E.problem_name, func.sum(case((passing, 1), else_=0)),
               func.sum(case((and_(passing, E.status == AuditStatus.failed), 1), else_=0)))
        .group_by(E.problem_name)).all()}
    return [ProblemSummary(name=name, description=(desc or "").strip().split("\n")[0][:200], submissions=counts.get(name, 0),
                           in_progress=active.get(name, 0), passed_benchmark=board.get(name, (0, 0))[0],
                           caught=board.get(name, (0, 0))[1])
            for name, desc in session.execute(select(Problem.name, Problem.description).order_by(Problem.name))]


def _row(e: LeaderboardEntry) -> BoardRow:
    audited = passes_every_stage(e)
    return BoardRow(submission_id=e.submission_id, submitter=e.submitter, solution_name=e.solution_name, kernel_ms=e.kernel_ms,
                    speedup=e.speedup, passes_benchmark=e.passes_benchmark, status=e.status, verdict=e.verdict,
                    caught_by=e.caught_by, stages={s: getattr(e, f"{s}_status") for s in STAGES},
                    benchmark_rank=e.benchmark_rank, audited_rank=e.audited_rank, audited=audited,
                    caught=e.passes_benchmark is True and e.status == AuditStatus.failed, finished_at=e.finished_at)


_FILTERS = {
    RowFilter.all: True,
    RowFilter.audited: and_(E.passes_benchmark.is_(True), E.status == AuditStatus.passed),
    RowFilter.caught: and_(E.passes_benchmark.is_(True), E.status == AuditStatus.failed),
    RowFilter.failed_benchmark: E.passes_benchmark.is_not(True),
    RowFilter.error: E.status.in_((AuditStatus.error, AuditStatus.timed_out)),
}


def board(session: Session, problem: str, show: RowFilter) -> list[BoardRow]:
    """Every submission with a finished audit, in the benchmark's order (by speedup): a kernel the audit caught
    stays where the benchmark alone would put it, marked, with no audited rank."""
    stmt = (select(E).where(E.problem_name == problem, _FILTERS[show])
            .order_by(E.benchmark_rank.is_(None), E.benchmark_rank, E.finished_at.desc()))
    return [_row(e) for e in session.scalars(stmt)]


def in_progress(session: Session, problem: str) -> list[InProgress]:
    rows = session.execute(
        select(Submission.id, Submission.submitter, Submission.solution_name, Audit.status)
        .join(Audit, Audit.submission_id == Submission.id)
        .where(Submission.problem_name == problem, Audit.status.in_(ACTIVE)).order_by(Audit.created_at)).all()
    return [InProgress(submission_id=r[0], submitter=r[1], solution_name=r[2], status=r[3]) for r in rows]


def _diagnosis(row: StageResultRow) -> list[str]:
    d = row.metrics.get("diagnosis") if isinstance(row.metrics, dict) else None
    return [str(x) for x in d] if isinstance(d, list) else []


def _evidence(row: StageResultRow) -> str:
    text = json.dumps({"metrics": row.metrics, "evidence": row.evidence}, indent=1, sort_keys=True, default=str)
    return text if len(text) <= EVIDENCE_CHARS else text[:EVIDENCE_CHARS] + "\n... (truncated: the full record is in the API)"


def submission(session: Session, submission_id: str) -> SubmissionView | None:
    sub = session.get(Submission, submission_id)
    if sub is None:
        return None
    audit = audits.latest_audit(session, sub.id)
    if audit is None:
        return None
    rows = list(session.scalars(select(StageResultRow).where(StageResultRow.audit_id == audit.id).order_by(StageResultRow.position)))
    done = audit.status in FINISHED
    probes = next((r for r in rows if r.name == "probes"), None)
    budgets = (probes.evidence.get("budgets") or {}) if probes is not None and isinstance(probes.evidence, dict) else {}
    entry = session.get(LeaderboardEntry, sub.id)
    stages = [StageView(name=r.name, status=r.status, summary=r.summary, diagnosis=_diagnosis(r), duration_s=r.duration_s,
                        evidence_json=_evidence(r) if done else None,
                        plots=plots.for_stage(r.name, r.metrics or {}, r.evidence or {}, budgets)) for r in rows]
    return SubmissionView(id=sub.id, problem=sub.problem_name, submitter=sub.submitter, solution_name=sub.solution_name,
                          created_at=sub.created_at, attempt=audit.attempt, status=audit.status, finished=done,
                          verdict=audit.verdict, summary=audit.summary, stages=stages,
                          benchmark_rank=entry.benchmark_rank if entry is not None and entry.attempt == audit.attempt else None,
                          audited_rank=entry.audited_rank if entry is not None and entry.attempt == audit.attempt else None)
