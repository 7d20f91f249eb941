"""The leaderboard's table (`leaderboard_entries`): one row per submission, from its latest finished audit, with
every rank precomputed, so that GET /v1/leaderboard and the dashboard read rows and compute nothing.

`refresh_entry` is called by `app.audits.events.audit_completed` inside the transaction that finishes the audit,
so the row commits or rolls back with the audit's final status. Nothing here commits."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel
from sqlalchemy import Row, func, select
from sqlalchemy.orm import Session

from app.audits.status import FINISHED, AuditStatus
from app.leaderboard.schemas import LeaderboardRow
from app.models import Audit, LeaderboardEntry, Problem, StageResultRow, Submission

STAGES = ("static", "benchmark", "probes", "canary")
FAILING = ("failed", "error")

Board = Literal["leaderboard", "audited"]


class RankChange(BaseModel):
    """A submission's rank moved on one board of one problem (None: not ranked there).

    board "leaderboard" is the rank GET /v1/leaderboard/{problem} shows (each submitter's best benchmark-passing
    kernel, by kernel time); "audited" is the dashboard's rank among kernels that pass every stage, by speedup."""

    problem: str
    submission_id: str
    submitter: str
    board: Board
    old_rank: int | None
    new_rank: int | None


def refresh_entry(session: Session, audit_id: str) -> list[RankChange]:
    """Write the leaderboard row of the audit's submission (if this is its latest finished audit) and re-rank the
    problem. Returns every rank that moved (the submission's own, and the ones it pushed), empty when nothing did.

    Serialised per problem by a row lock on the problem (Postgres), so two audits finishing at once cannot rank from
    stale snapshots; SQLite serialises writers itself."""
    problem = _write_entry(session, audit_id)
    return [] if problem is None else rerank(session, problem)


def rebuild(session: Session) -> int:
    """Every submission's row from its latest finished audit, then every problem re-ranked (the migration's backfill)."""
    latest = (select(Audit.submission_id, func.max(Audit.attempt).label("attempt"))
              .where(Audit.status.in_(FINISHED)).group_by(Audit.submission_id).subquery())
    ids = session.scalars(select(Audit.id).join(latest, (latest.c.submission_id == Audit.submission_id)
                                                & (latest.c.attempt == Audit.attempt))).all()
    problems = {p for p in (_write_entry(session, i) for i in ids) if p is not None}
    for p in sorted(problems):
        rerank(session, p)
    return len(ids)


def _write_entry(session: Session, audit_id: str) -> str | None:
    head = session.execute(
        select(Audit.attempt, Audit.status, Audit.verdict, Audit.finished_at, Submission.id, Submission.problem_name,
               Submission.submitter, Submission.solution_name)
        .join(Submission, Submission.id == Audit.submission_id).where(Audit.id == audit_id)).one_or_none()
    if head is None or head.status not in FINISHED:
        return None
    # FOR NO KEY UPDATE: serialises the problem's re-ranking without blocking inserts that reference the problem
    session.execute(select(Problem.name).where(Problem.name == head.problem_name).with_for_update(key_share=True))
    entry = session.get(LeaderboardEntry, head.id, populate_existing=True)
    if entry is not None and entry.attempt > head.attempt:
        return None  # an older attempt finishing late (the reaper) does not replace a newer result
    stages = {r.name: r for r in session.execute(
        select(StageResultRow.name, StageResultRow.status, StageResultRow.metrics, StageResultRow.position)
        .where(StageResultRow.audit_id == audit_id))}
    values = dict(audit_id=audit_id, attempt=head.attempt, problem_name=head.problem_name, submitter=head.submitter,
                  solution_name=head.solution_name, status=head.status, verdict=head.verdict, finished_at=head.finished_at,
                  **_from_stages(stages))
    if entry is None:
        session.add(LeaderboardEntry(submission_id=head.id, **values))
    else:
        for k, v in values.items():
            setattr(entry, k, v)
    session.flush()
    return str(head.problem_name)


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) else None


def _from_stages(stages: dict[str, Row[Any]]) -> dict[str, Any]:
    """The few numbers and statuses the boards show, from the audit's stage rows."""
    bench, probes, verdict = stages.get("benchmark"), stages.get("probes"), stages.get("verdict")
    vm = verdict.metrics if verdict is not None else {}
    passes = vm.get("passes_benchmark")
    if passes is None and bench is not None:
        passes = bench.status == "passed"
    # sound only if the probes ran: skipped probes say nothing either way
    sound = None if probes is None or probes.status == "skipped" else vm.get("numerically_sound")
    if sound is None and probes is not None and probes.status != "skipped":
        sound = probes.status == "passed"
    bm = bench.metrics if bench is not None else {}
    kernel, ref = _finite(bm.get("kernel_median_ms")), _finite(bm.get("reference_median_ms"))
    speedup = _finite(bm.get("speedup")) or (ref / kernel if kernel and ref else None)
    # the verdict's own list where it has one (failures only: an error is inconclusive, never a catch)
    caught = list(vm.get("caught_by") or []) if "caught_by" in vm else [s.name for s in sorted(stages.values(), key=lambda r: r.position)
                                                   if s.name != "verdict" and s.status in FAILING]
    return dict(kernel_ms=kernel, reference_ms=ref, speedup=speedup, passes_benchmark=passes, numerically_sound=sound,
                caught_by=caught[0] if caught else None,
                **{f"{name}_status": stages[name].status if name in stages else None for name in STAGES})


# ---------------------------------------------------------------- ranks


@dataclass(frozen=True)
class _Ranked:
    rank: int | None
    sound_rank: int | None
    benchmark_rank: int | None
    audited_rank: int | None


def _by_time(e: LeaderboardEntry) -> tuple[float, str]:
    return (e.kernel_ms if e.kernel_ms is not None else math.inf, e.submission_id)


def _by_speedup(e: LeaderboardEntry) -> tuple[float, float, str]:
    return (-e.speedup if e.speedup is not None else math.inf, *_by_time(e))


def _best_per_submitter(entries: Iterable[LeaderboardEntry]) -> dict[str, int]:
    best: dict[str, LeaderboardEntry] = {}
    for e in entries:
        cur = best.get(e.submitter)
        if cur is None or _by_time(e) < _by_time(cur):
            best[e.submitter] = e
    return _numbered(best.values(), _by_time)


def _numbered(entries: Iterable[LeaderboardEntry], key: Callable[[LeaderboardEntry], Any]) -> dict[str, int]:
    return {e.submission_id: i for i, e in enumerate(sorted(entries, key=key), start=1)}


def passes_every_stage(e: LeaderboardEntry) -> bool:
    return e.passes_benchmark is True and e.status == AuditStatus.passed


def ranks(entries: list[LeaderboardEntry]) -> dict[str, _Ranked]:
    passing = [e for e in entries if e.passes_benchmark is True]
    api = _best_per_submitter(passing)
    sound = _best_per_submitter(e for e in passing if e.numerically_sound is True)
    bench = _numbered(passing, _by_speedup)
    audited = _numbered((e for e in passing if passes_every_stage(e)), _by_speedup)
    return {e.submission_id: _Ranked(api.get(e.submission_id), sound.get(e.submission_id), bench.get(e.submission_id),
                                     audited.get(e.submission_id)) for e in entries}


def rerank(session: Session, problem: str) -> list[RankChange]:
    """Recompute the problem's ranks; only rows whose ranks moved are written."""
    entries = list(session.scalars(select(LeaderboardEntry).where(LeaderboardEntry.problem_name == problem)))
    changes: list[RankChange] = []
    computed = ranks(entries)
    for e in entries:
        new = computed[e.submission_id]
        for board, old_rank, new_rank in (("leaderboard", e.rank, new.rank), ("audited", e.audited_rank, new.audited_rank)):
            if old_rank != new_rank:
                changes.append(RankChange(problem=problem, submission_id=e.submission_id, submitter=e.submitter,
                                          board=board, old_rank=old_rank, new_rank=new_rank))  # type: ignore[arg-type]
        e.rank, e.sound_rank, e.benchmark_rank, e.audited_rank = new.rank, new.sound_rank, new.benchmark_rank, new.audited_rank
        e.row_json = _serialised(e, new.rank)
        e.sound_row_json = _serialised(e, new.sound_rank)
    session.flush()
    return changes


def _serialised(e: LeaderboardEntry, rank: int | None) -> str | None:
    """The row as GET /v1/leaderboard returns it, stored so that a GET joins strings and builds no objects."""
    if rank is None:
        return None
    return LeaderboardRow(rank=rank, submitter=e.submitter, submission_id=e.submission_id, solution_name=e.solution_name,
                          kernel_ms=e.kernel_ms, reference_ms=e.reference_ms, speedup=e.speedup,
                          passes_benchmark=e.passes_benchmark, numerically_sound=e.numerically_sound, verdict=e.verdict,
                          audited_at=e.finished_at).model_dump_json()
