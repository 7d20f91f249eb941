"""What the dashboard's pages show, read from the database into pydantic models (no API key ever leaves here:
the models carry submitter names, never keys)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy import and_, case, func, select
from sqlalchemy.orm import Session

from app.audits import repository as audits
from app.audits.status import FINISHED, AuditStatus
from app.dashboard import plots
from app.leaderboard.identity import CPU
from app.leaderboard.schemas import LeaderboardRow
from app.models import Audit, LeaderboardEntry, Problem, StageResultRow, Submission
from worker.registry import INTAKE, VERDICT, stage_order
from worker.report import StageStatus

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
    """A leaderboard entry (a kernel on one hardware, its identical runs folded in: the numbers are the entry's, as
    GET /v1/leaderboard returns them, from app.leaderboard.ranking), or an unranked run (error, timed out, failed
    benchmark, no speedup), shown on its own."""

    submission_id: str
    submitter: str
    solution_name: str
    hardware: str | None
    kernel_ms: float | None
    speedup: float | None
    speedup_ci: list[float] | None = None
    runs: int = 1
    tied: bool = False
    indicative: bool = False
    passes_benchmark: bool | None
    status: str
    verdict: str | None
    caught_by: str | None
    stages: dict[str, StageStatus] = Field(
        description="the entry's, as GET /v1/leaderboard shows it; an unranked run's own"
    )
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
    # a run of a kernel submitted before: the ranks above are that entry's, shown under its earliest submission
    folded_into: str | None = None
    entry_runs: int | None = None
    hardware: str | None = None
    speedup_ci: list[float] | None = None


def problems(session: Session) -> list[ProblemSummary]:
    counts = dict(
        session.execute(select(Submission.problem_name, func.count()).group_by(Submission.problem_name)).all()
    )
    active = dict(
        session.execute(
            select(Submission.problem_name, func.count())
            .join(Audit, Audit.submission_id == Submission.id)
            .where(Audit.status.in_(ACTIVE))
            .group_by(Submission.problem_name)
        ).all()
    )
    passing = E.passes_benchmark.is_(True)
    board = {
        r[0]: (int(r[1] or 0), int(r[2] or 0))
        for r in session.execute(
            select(
                E.problem_name,
                func.sum(case((passing, 1), else_=0)),
                func.sum(case((and_(passing, E.status == AuditStatus.failed), 1), else_=0)),
            ).group_by(E.problem_name)
        ).all()
    }
    return [
        ProblemSummary(
            name=name,
            description=(desc or "").strip().split("\n")[0][:200],
            submissions=counts.get(name, 0),
            in_progress=active.get(name, 0),
            passed_benchmark=board.get(name, (0, 0))[0],
            caught=board.get(name, (0, 0))[1],
        )
        for name, desc in session.execute(
            select(Problem.name, Problem.description)
            # public problems only: uploads are private until an admin publishes them
            .where(Problem.public.is_(True), Problem.deleted_at.is_(None))
            .order_by(Problem.name)
        )
    ]


def board_stages(rows: Iterable[BoardRow]) -> tuple[str, ...]:
    """The board's stage columns: every registered stage (worker.registry), then any other a row holds (a stage only the
    workers had registered). Not intake: a run that did not pass it has no other stage to show, and every other run did;
    not the verdict, which has its own column."""
    names = dict.fromkeys(s for s in stage_order() if s not in (INTAKE, VERDICT))
    names.update(dict.fromkeys(s for r in rows for s in r.stages if s not in (INTAKE, VERDICT)))
    return tuple(names)


def _row(e: LeaderboardEntry, own: dict[str, StageStatus]) -> BoardRow:
    common = dict(
        submission_id=e.submission_id,
        submitter=e.submitter,
        solution_name=e.solution_name,
        hardware=e.hardware,
        passes_benchmark=e.passes_benchmark,
        status=e.status,
        benchmark_rank=e.benchmark_rank,
        audited_rank=e.audited_rank,
        finished_at=e.finished_at,
    )
    if e.row_json is not None:  # an entry: its numbers, verdict, catch and stages cover every run folded into it
        entry = LeaderboardRow.model_validate_json(e.row_json)
        return BoardRow(
            **common,
            stages=entry.stages,
            kernel_ms=entry.kernel_ms,
            speedup=entry.speedup,
            speedup_ci=entry.speedup_ci,
            runs=entry.runs,
            tied=entry.tied,
            indicative=entry.indicative,
            verdict=entry.verdict,
            caught_by=entry.caught_by,
            audited=e.audited_rank is not None,
            caught=e.audited_rank is None,
        )
    ci = [e.speedup_lo, e.speedup_hi] if e.speedup_lo is not None and e.speedup_hi is not None else None
    return BoardRow(
        **common,
        stages=own,
        kernel_ms=e.kernel_ms,
        speedup=e.speedup,
        speedup_ci=ci,
        indicative=bool(e.indicative),
        verdict=e.verdict,
        caught_by=e.caught_by,
        audited=e.passes_benchmark is True and e.status == AuditStatus.passed,
        caught=e.passes_benchmark is True and e.status == AuditStatus.failed,
    )


def _shown(row: BoardRow, show: RowFilter) -> bool:
    if show is RowFilter.audited:
        return row.audited
    if show is RowFilter.caught:
        return row.caught
    if show is RowFilter.failed_benchmark:
        return row.passes_benchmark is not True
    if show is RowFilter.error:
        return row.status in (AuditStatus.error, AuditStatus.timed_out)
    return True


def board(session: Session, problem: str, show: RowFilter) -> list[BoardRow]:
    """Every entry of the problem's boards (app.leaderboard.ranking), hardware by hardware (the GPUs', then the
    CPU's) in rank order, then every unranked run, latest first. A run folded into an entry (the same kernel
    submitted again) is not listed on its own: the entry counts it. A kernel an audit caught stays where the
    benchmark puts it, marked, with no audited rank."""
    listed = (E.problem_name == problem, E.folded_into.is_(None))
    stmt = (
        select(E)
        .where(*listed)
        .order_by(E.position.is_(None), E.hardware == CPU, E.hardware, E.position, E.finished_at.desc())
    )
    stages = audits.stage_statuses(session, select(E.audit_id).where(*listed))
    return [r for r in (_row(e, stages.get(e.audit_id, {})) for e in session.scalars(stmt)) if _shown(r, show)]


def in_progress(session: Session, problem: str) -> list[InProgress]:
    rows = session.execute(
        select(Submission.id, Submission.submitter, Submission.solution_name, Audit.status)
        .join(Audit, Audit.submission_id == Submission.id)
        .where(Submission.problem_name == problem, Audit.status.in_(ACTIVE))
        .order_by(Audit.created_at)
    ).all()
    return [InProgress(submission_id=r[0], submitter=r[1], solution_name=r[2], status=r[3]) for r in rows]


def _diagnosis(row: StageResultRow) -> list[str]:
    d = row.metrics.get("diagnosis") if isinstance(row.metrics, dict) else None
    return [str(x) for x in d] if isinstance(d, list) else []


def _evidence(row: StageResultRow) -> str:
    text = json.dumps({"metrics": row.metrics, "evidence": row.evidence}, indent=1, sort_keys=True, default=str)
    return (
        text
        if len(text) <= EVIDENCE_CHARS
        else text[:EVIDENCE_CHARS] + "\n... (truncated: the full record is in the API)"
    )


def submission(session: Session, submission_id: str) -> SubmissionView | None:
    sub = session.get(Submission, submission_id)
    if sub is None:
        return None
    audit = audits.latest_audit(session, sub.id)
    if audit is None:
        return None
    rows = list(
        session.scalars(
            select(StageResultRow).where(StageResultRow.audit_id == audit.id).order_by(StageResultRow.position)
        )
    )
    done = audit.status in FINISHED
    probes = next((r for r in rows if r.name == "probes"), None)
    budgets = (probes.evidence.get("budgets") or {}) if probes is not None and isinstance(probes.evidence, dict) else {}
    entry = session.get(LeaderboardEntry, sub.id)
    current = entry is not None and entry.attempt == audit.attempt
    shown = (
        session.get(LeaderboardEntry, entry.folded_into)
        if current and entry is not None and entry.folded_into
        else entry
    )
    stages = [
        StageView(
            name=r.name,
            status=r.status,
            summary=r.summary,
            diagnosis=_diagnosis(r),
            duration_s=r.duration_s,
            evidence_json=_evidence(r) if done else None,
            plots=plots.for_stage(r.name, r.metrics or {}, r.evidence or {}, budgets),
        )
        for r in rows
    ]
    return SubmissionView(
        id=sub.id,
        problem=sub.problem_name,
        submitter=sub.submitter,
        solution_name=sub.solution_name,
        created_at=sub.created_at,
        attempt=audit.attempt,
        status=audit.status,
        finished=done,
        verdict=audit.verdict,
        summary=audit.summary,
        stages=stages,
        benchmark_rank=shown.benchmark_rank if current and shown is not None else None,
        audited_rank=shown.audited_rank if current and shown is not None else None,
        folded_into=entry.folded_into if current and entry is not None else None,
        entry_runs=shown.runs if current and shown is not None else None,
        hardware=entry.hardware if current and entry is not None else None,
        speedup_ci=_ci(entry) if current and entry is not None else None,
    )


def _ci(e: LeaderboardEntry) -> list[float] | None:
    return [e.speedup_lo, e.speedup_hi] if e.speedup_lo is not None and e.speedup_hi is not None else None
