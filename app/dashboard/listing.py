"""The dashboard's long tables, as the browser asks for them in the address: search, filters, sort and page.

Everything here reads; nothing ranks. The leaderboard's rows and their order come from app.dashboard.queries.board
(the one ranking, app.leaderboard.ranking): a board is filtered, sorted and cut into pages here, on the server, so a
page carries one page of rows. The submissions table (every submission, queued ones too: the long one) is
filtered, sorted and paged in SQL. The live view lists the audits that are queued or running, with the progress
the API computes (app.submissions.views.progress) and the queue position (app.audits.repository); it is a public
summary (app/submissions/disclosure.py): statuses, stage names, times and positions, never a stage's text.

Only public problems (the catalogue and published uploads, not deleted) are listed: an upload is private to its
owner and admins until an admin publishes it."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, Field, model_validator
from sqlalchemy import ColumnElement, Select, and_, func, or_, select
from sqlalchemy.orm import Session

from app.audits.status import FINISHED, AuditStatus
from app.core.db import utcnow
from app.dashboard.queries import BoardRow, RowFilter, board
from app.leaderboard.identity import CPU
from app.models import Audit, LeaderboardEntry, Problem, StageResultRow, Submission
from app.submissions.views import progress

T = TypeVar("T")
E = LeaderboardEntry
PER_PAGE = 25
MAX_PER_PAGE = 200
MAX_QUERY = 200
MAX_TRACKED = 20
ACTIVE = (AuditStatus.queued, AuditStatus.running)
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


class Direction(StrEnum):
    asc = "asc"
    desc = "desc"


class Listing(BaseModel):
    """What the address asks of a table: ?q=&submitter=&hardware=&sort=&dir=&page=&per_page=."""

    q: str = Field("", max_length=MAX_QUERY, description="words, each found in the problem, solution or submitter")
    submitter: str = Field("", max_length=200)
    hardware: str = Field("", max_length=200)
    sort: str = Field("", max_length=32)
    dir: Direction | None = None
    page: int = Field(1, ge=1, le=1_000_000)
    per_page: int = Field(PER_PAGE, ge=1, le=MAX_PER_PAGE)

    @model_validator(mode="before")
    @classmethod
    def _blank_is_default(cls, data: Any) -> Any:
        """A form's empty field (`?dir=&page=`) asks for nothing: the default."""
        return {k: v for k, v in data.items() if v != ""} if isinstance(data, dict) else data

    def words(self) -> list[str]:
        return [w.lower() for w in self.q.split()][:10]

    def query(self, **change: Any) -> dict[str, str]:
        """These parameters with `change` applied, as an address's query (defaults left out)."""
        values = {**self.model_dump(mode="json"), **change}
        defaults = {"q": "", "submitter": "", "hardware": "", "sort": "", "dir": None, "page": 1, "per_page": PER_PAGE}
        return {k: str(v) for k, v in values.items() if k in defaults and v is not None and v != defaults[k]}


class Page(BaseModel, Generic[T]):
    rows: list[T]
    total: int
    page: int
    pages: int
    per_page: int
    sort: str
    dir: Direction
    submitters: list[str] = Field(default_factory=list, description="the filter's choices")
    hardware: list[str] = Field(default_factory=list, description="the filter's choices")

    @property
    def first(self) -> int:
        return 0 if self.total == 0 else (self.page - 1) * self.per_page + 1

    @property
    def last(self) -> int:
        return min(self.total, self.page * self.per_page)


def _pages(total: int, per_page: int) -> int:
    return max(1, math.ceil(total / per_page))


# ---------------------------------------------------------------- the leaderboard


# column -> (key of a row, the direction a click on the header sorts first)
_BOARD_SORTS: dict[str, tuple[Callable[[BoardRow], Any], Direction]] = {
    "rank": (lambda r: 0, Direction.asc),  # the board's own order (hardware by hardware, then by rank)
    "audited": (lambda r: r.audited_rank, Direction.asc),
    "benchmark": (lambda r: r.benchmark_rank, Direction.asc),
    "solution": (lambda r: r.solution_name.lower(), Direction.asc),
    "submitter": (lambda r: r.submitter.lower(), Direction.asc),
    "hardware": (lambda r: r.hardware, Direction.asc),
    "speedup": (lambda r: r.speedup, Direction.desc),
    "kernel_ms": (lambda r: r.kernel_ms, Direction.asc),
    "finished": (lambda r: r.finished_at, Direction.desc),
}
BOARD_SORTS = tuple(_BOARD_SORTS)


def _sorted(rows: list[T], key: Callable[[T], Any], direction: Direction) -> list[T]:
    """Stable; rows with no value (None) last whichever the direction."""
    present = [r for r in rows if key(r) is not None]
    absent = [r for r in rows if key(r) is None]
    return sorted(present, key=key, reverse=direction is Direction.desc) + absent


def _matches(words: Sequence[str], *fields: str | None) -> bool:
    text = " ".join(f.lower() for f in fields if f)
    return all(w in text for w in words)


def board_page(session: Session, problem: str, show: RowFilter, want: Listing) -> Page[BoardRow]:
    """One page of the problem's board (queries.board: every entry, ranked), filtered by submitter, hardware and
    the search words (solution, submitter, hardware), sorted by a column or in the board's own order."""
    rows = board(session, problem, show)
    submitters = sorted({r.submitter for r in rows}, key=str.lower)
    hardware = sorted({r.hardware for r in rows if r.hardware}, key=lambda h: (h == CPU, h))
    words = want.words()
    kept = [
        r
        for r in rows
        if (not want.submitter or r.submitter == want.submitter)
        and (not want.hardware or r.hardware == want.hardware)
        and _matches(words, r.solution_name, r.submitter, r.hardware, problem)
    ]
    sort = want.sort if want.sort in _BOARD_SORTS else "rank"
    key, first = _BOARD_SORTS[sort]
    direction = want.dir or first
    if sort != "rank":
        kept = _sorted(kept, key, direction)
    elif direction is not Direction.asc:
        kept = kept[::-1]
    pages = _pages(len(kept), want.per_page)
    page = min(want.page, pages)
    start = (page - 1) * want.per_page
    return Page[BoardRow](
        rows=kept[start : start + want.per_page],
        total=len(kept),
        page=page,
        pages=pages,
        per_page=want.per_page,
        sort=sort,
        dir=direction,
        submitters=submitters,
        hardware=hardware,
    )


# ---------------------------------------------------------------- every submission


class SubmissionRow(BaseModel):
    submission_id: str
    problem: str
    solution_name: str
    submitter: str
    created_at: datetime
    status: str
    verdict: str | None
    caught_by: str | None
    hardware: str | None
    speedup: float | None
    folded_into: str | None


def _latest_audit() -> Any:
    return (
        select(Audit.submission_id, func.max(Audit.attempt).label("attempt"))
        .group_by(Audit.submission_id)
        .subquery("latest")
    )


def _public(stmt: Select[Any]) -> Select[Any]:
    return stmt.join(Problem, Problem.name == Submission.problem_name).where(
        Problem.public.is_(True), Problem.deleted_at.is_(None)
    )


def _like(word: str) -> str:
    return "%" + word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def submissions_page(session: Session, want: Listing, problem: str | None = None) -> Page[SubmissionRow]:
    """One page of every submission (of one problem, or of all), with its latest audit's status and, once that
    audit has finished, the board's numbers; newest first unless a column is chosen."""
    latest = _latest_audit()
    # the hardware a run was timed on once it finished; the device it was sent to before
    hardware = func.coalesce(E.hardware, Audit.device)
    sorts: dict[str, tuple[Any, Direction]] = {
        "submitted": (Submission.created_at, Direction.desc),
        "problem": (func.lower(Submission.problem_name), Direction.asc),
        "solution": (func.lower(Submission.solution_name), Direction.asc),
        "submitter": (func.lower(Submission.submitter), Direction.asc),
        "status": (Audit.status, Direction.asc),
        "hardware": (hardware, Direction.asc),
        "speedup": (E.speedup, Direction.desc),
    }
    base = _public(
        select(
            Submission.id,
            Submission.problem_name,
            Submission.solution_name,
            Submission.submitter,
            Submission.created_at,
            Audit.status,
            Audit.verdict,
            E.caught_by,
            hardware.label("hardware"),
            E.speedup,
            E.folded_into,
        )
        .join(latest, latest.c.submission_id == Submission.id)
        .join(Audit, and_(Audit.submission_id == Submission.id, Audit.attempt == latest.c.attempt))
        # the board's numbers are the finished attempt's: a re-audit in progress shows its own status, no numbers
        .outerjoin(E, and_(E.submission_id == Submission.id, E.attempt == Audit.attempt))
    )
    where: list[ColumnElement[bool]] = []
    if problem is not None:
        where.append(Submission.problem_name == problem)
    if want.submitter:
        where.append(Submission.submitter == want.submitter)
    if want.hardware:
        where.append(hardware == want.hardware)
    for w in want.words():
        pattern = _like(w)
        where.append(
            or_(
                Submission.problem_name.ilike(pattern, escape="\\"),
                Submission.solution_name.ilike(pattern, escape="\\"),
                Submission.submitter.ilike(pattern, escape="\\"),
            )
        )
    filtered = base.where(*where)
    total = int(session.scalar(select(func.count()).select_from(filtered.subquery())) or 0)
    sort = want.sort if want.sort in sorts else "submitted"
    column, first = sorts[sort]
    direction = want.dir or first
    ordered = column.desc() if direction is Direction.desc else column.asc()
    pages = _pages(total, want.per_page)
    page = min(want.page, pages)
    rows = session.execute(
        filtered.order_by(column.is_(None), ordered, Submission.created_at.desc(), Submission.id)
        .limit(want.per_page)
        .offset((page - 1) * want.per_page)
    ).all()
    # the filters' choices, from the same public submissions (and problem) the table lists
    scope = _public(
        select(Submission.submitter)
        .join(latest, latest.c.submission_id == Submission.id)
        .join(Audit, and_(Audit.submission_id == Submission.id, Audit.attempt == latest.c.attempt))
        .outerjoin(E, and_(E.submission_id == Submission.id, E.attempt == Audit.attempt))
    )
    if problem is not None:
        scope = scope.where(Submission.problem_name == problem)
    submitters = sorted(set(session.scalars(scope.distinct())), key=str.lower)
    kinds = session.scalars(scope.with_only_columns(hardware).distinct())
    return Page[SubmissionRow](
        rows=[
            SubmissionRow(
                submission_id=r[0],
                problem=r[1],
                solution_name=r[2],
                submitter=r[3],
                created_at=r[4],
                status=r[5],
                verdict=r[6],
                caught_by=r[7],
                hardware=r[8],
                speedup=r[9],
                folded_into=r[10],
            )
            for r in rows
        ],
        total=total,
        page=page,
        pages=pages,
        per_page=want.per_page,
        sort=sort,
        dir=direction,
        submitters=submitters,
        hardware=sorted({k for k in kinds if k}, key=lambda h: (h == CPU, h)),
    )


# ---------------------------------------------------------------- audits in progress


class LiveAudit(BaseModel):
    """A queued or running audit as anyone may see it (the public summary), or one the page was following that
    has finished since (its final status and verdict)."""

    submission_id: str
    problem: str
    solution_name: str
    submitter: str
    attempt: int
    status: str
    finished: bool
    queue_position: int | None = None
    waiting_s: float | None = Field(None, description="queued: seconds since it was sent to its queue")
    current_stage: str | None = None
    current_stage_elapsed_s: float | None = None
    elapsed_s: float | None = Field(None, description="running: seconds since it started; finished: how long it ran")
    stages_done: int = 0
    stages_total: int = 0
    verdict: str | None = None
    finished_at: datetime | None = None


def tracked_ids(raw: str) -> list[str]:
    """The `track` parameter: submission ids the page saw in progress, comma-separated; anything else is dropped."""
    return list(dict.fromkeys(t for t in raw.split(",") if _ID.fullmatch(t)))[:MAX_TRACKED]


def live_audits(session: Session, problem: str | None = None, track: Sequence[str] = ()) -> list[LiveAudit]:
    """Every audit queued or running (the latest attempt of each submission, of one problem or of all public ones),
    running ones first, then the queue in order; then the tracked submissions whose latest audit has finished."""
    stmt = _public(_latest_audits())
    if problem is not None:
        stmt = stmt.where(Submission.problem_name == problem)
    wanted = or_(Audit.status.in_(ACTIVE), Audit.submission_id.in_(list(track))) if track else Audit.status.in_(ACTIVE)
    return _live(session, session.execute(stmt.where(wanted)).all())


def audit_progress(session: Session, submission_id: str) -> LiveAudit | None:
    """The submission's latest audit as the live view shows it (for its own page, which has already decided that
    its viewer may see it)."""
    found = _live(session, session.execute(_latest_audits().where(Audit.submission_id == submission_id)).all())
    return found[0] if found else None


def _latest_audits() -> Select[Any]:
    latest = _latest_audit()
    return (
        select(Audit, Submission.problem_name, Submission.solution_name, Submission.submitter)
        .join(Submission, Submission.id == Audit.submission_id)
        .join(latest, and_(latest.c.submission_id == Audit.submission_id, latest.c.attempt == Audit.attempt))
    )


def _live(session: Session, found: Sequence[Any]) -> list[LiveAudit]:
    now = utcnow()
    audits = [row[0] for row in found]
    positions = _queue_positions(session, [a for a in audits if a.status == AuditStatus.queued])
    running = [a.id for a in audits if a.status == AuditStatus.running]
    stored: dict[str, list[StageResultRow]] = {i: [] for i in running}
    if running:
        for r in session.scalars(
            select(StageResultRow).where(StageResultRow.audit_id.in_(running)).order_by(StageResultRow.position)
        ):
            stored[r.audit_id].append(r)
    out = []
    for audit, problem_name, solution_name, submitter in found:
        item = LiveAudit(
            submission_id=audit.submission_id,
            problem=problem_name,
            solution_name=solution_name,
            submitter=submitter,
            attempt=audit.attempt,
            status=audit.status,
            finished=audit.status in FINISHED,
        )
        if audit.status == AuditStatus.queued:
            item.queue_position = positions.get(audit.id)
            item.waiting_s = max(0.0, (now - audit.enqueued_at).total_seconds()) if audit.enqueued_at else None
        elif audit.status == AuditStatus.running:
            p = progress(audit, stored[audit.id], now)
            if p is not None:
                item.current_stage, item.current_stage_elapsed_s = p.current_stage, p.current_stage_elapsed_s
                item.elapsed_s, item.stages_done, item.stages_total = p.elapsed_s, p.stages_done, p.stages_total
        else:
            item.verdict, item.finished_at = audit.verdict, audit.finished_at
            if audit.started_at and audit.finished_at:
                item.elapsed_s = max(0.0, (audit.finished_at - audit.started_at).total_seconds())
        out.append(item)
    order = {AuditStatus.running: 0, AuditStatus.queued: 1}
    return sorted(
        out,
        key=lambda a: (
            order.get(AuditStatus(a.status), 2),
            a.queue_position or 0,
            -(a.elapsed_s or 0.0) if a.status == AuditStatus.running else 0.0,
            a.submission_id,
        ),
    )


def _queue_positions(session: Session, queued: Sequence[Audit]) -> dict[str, int]:
    """1 = next to run, as app.audits.repository.queue_position counts (queued audits of the same queue enqueued
    before it, plus one), for every queued audit in one query."""
    if not queued:
        return {}
    ranked = (
        select(Audit.id, (func.rank().over(partition_by=Audit.queue, order_by=Audit.enqueued_at)).label("pos"))
        .where(Audit.status == AuditStatus.queued)
        .subquery()
    )
    ids = [a.id for a in queued]
    return {i: int(p) for i, p in session.execute(select(ranked.c.id, ranked.c.pos).where(ranked.c.id.in_(ids)))}


# ---------------------------------------------------------------- the problem's history


_COLOURS = ("#0969da", "#1a7f37", "#8250df", "#bc4c00", "#0a3069")


def _speedup_ticks(lo: float, hi: float) -> list[float]:
    """1, 2, 3, 5 in each decade between lo and hi: a log axis people can read."""
    out = []
    for decade in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        out += [m * 10.0**decade for m in (1, 2, 3, 5)]
    return [t for t in out if lo <= t <= hi] or [1.0]


def _iso(t: datetime) -> str:
    return t.isoformat(timespec="seconds")


def history_figure(session: Session, problem: str) -> dict[str, Any] | None:
    """Speedup over time of the runs that passed every stage (sound kernels), one trace per hardware with the best so
    far as a step line; runs the benchmark passed and an audit caught are a trace of their own, hidden until
    clicked in the legend. None when no sound kernel has a speedup yet."""
    import plotly.graph_objects as go

    rows = session.execute(
        select(E.finished_at, E.speedup, E.hardware, E.solution_name, E.submitter, E.status, E.submission_id)
        .where(
            E.problem_name == problem,
            E.passes_benchmark.is_(True),
            E.speedup.is_not(None),
            E.finished_at.is_not(None),
            E.status.in_((AuditStatus.passed, AuditStatus.failed)),
        )
        .order_by(E.finished_at)
    ).all()
    sound = [r for r in rows if r.status == AuditStatus.passed and r.speedup is not None and math.isfinite(r.speedup)]
    if not sound:
        return None
    fig = go.Figure()
    for i, hw in enumerate(sorted({r.hardware or "unknown" for r in sound}, key=lambda h: (h == CPU, h))):
        colour = _COLOURS[i % len(_COLOURS)]
        mine = [r for r in sound if (r.hardware or "unknown") == hw]
        text = [f"{r.solution_name} by {r.submitter}" for r in mine]
        fig.add_trace(
            go.Scatter(
                x=[_iso(r.finished_at) for r in mine],
                y=[r.speedup for r in mine],
                mode="markers",
                name=f"{hw}: runs",
                text=text,
                marker=dict(size=8, color=colour, opacity=0.75),
                legendgroup=hw,
                hovertemplate="%{text}<br>%{y:.3g}x<br>%{x|%Y-%m-%d %H:%M} UTC<extra></extra>",
            )
        )
        best, xs, ys = -math.inf, [], []
        for r in mine:
            best = max(best, float(r.speedup))
            xs.append(_iso(r.finished_at))
            ys.append(best)
        xs.append(_iso(max(utcnow(), mine[-1].finished_at)))
        ys.append(best)
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                line=dict(shape="hv", width=2.5, color=colour),
                name=f"{hw}: best so far",
                legendgroup=hw,
                hovertemplate="best so far %{y:.3g}x<extra></extra>",
            )
        )
    caught = [r for r in rows if r.status == AuditStatus.failed and r.speedup is not None and math.isfinite(r.speedup)]
    if caught:
        fig.add_trace(
            go.Scatter(
                x=[_iso(r.finished_at) for r in caught],
                y=[r.speedup for r in caught],
                mode="markers",
                name="caught by the audit",
                visible="legendonly",
                marker=dict(symbol="x", size=8, color="#cf222e"),
                text=[f"{r.solution_name} by {r.submitter}" for r in caught],
                hovertemplate="%{text}<br>%{y:.3g}x (not sound)<extra></extra>",
            )
        )
    fig.add_hline(y=1.0, line=dict(dash="dot", color="#6e7781", width=1))
    # on a log axis an annotation's y is log10 of the value: 0 is 1x
    fig.add_annotation(
        x=1,
        xref="paper",
        xanchor="right",
        y=0,
        yref="y",
        yanchor="top",
        text="reference (1x)",
        showarrow=False,
        font=dict(color="#6e7781"),
    )
    values = [
        float(r.speedup) for r in rows if r.speedup is not None and r.speedup > 0 and math.isfinite(r.speedup)
    ] + [1.0]
    ticks = _speedup_ticks(min(values) / 1.3, max(values) * 1.3)
    fig.update_layout(
        title="speedup of sound kernels over time",
        template="plotly_white",
        height=320,
        margin=dict(l=60, r=20, t=50, b=40),
        legend=dict(orientation="h", y=-0.2),
        xaxis=dict(title=None),
        yaxis=dict(title="speedup over the reference", type="log", tickvals=ticks, ticktext=[f"{t:g}x" for t in ticks]),
    )
    out: dict[str, Any] = fig.to_plotly_json()
    return out
