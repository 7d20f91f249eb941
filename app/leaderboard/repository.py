"""The leaderboard's table (`leaderboard_entries`): one row per submission, from its latest finished audit, with
every rank precomputed by the one ranking function (app.leaderboard.ranking), so that GET /v1/leaderboard, the
dashboard and the rank-change webhooks read the same ranks and compute nothing.

A run that is folded into another submission's entry (the same kernel) names it in `folded_into` and has no rank;
the entry's submission holds the ranks, the entry's position on each board and the entry serialised as the API
returns it.

`refresh_entry` is called by `app.audits.events.audit_completed` inside the transaction that finishes the audit,
so the row commits or rolls back with the audit's final status. Nothing here commits."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel
from sqlalchemy import Row, func, select
from sqlalchemy.orm import Session

from app.audits.repository import stage_statuses
from app.audits.status import FINISHED
from app.leaderboard import identity
from app.leaderboard.ranking import Board, Entry, Run, rank_boards
from app.leaderboard.schemas import LeaderboardRow
from app.models import Audit, LeaderboardEntry, Problem, StageResultRow, Submission
from worker.report import StageStatus

FAILING = ("failed", "error")

# the boards as the webhooks name them: "leaderboard" is the benchmark board (GET /v1/leaderboard's default)
WebhookBoard = Literal["leaderboard", "audited"]
_WEBHOOK_BOARD: dict[Board, WebhookBoard] = {"benchmark": "leaderboard", "audited": "audited"}


class RankChange(BaseModel):
    """A submission's rank moved on one board of one problem (None: not ranked there, or folded into another
    submission's entry of the same kernel).

    board "leaderboard" is the rank GET /v1/leaderboard/{problem} shows (every kernel that passes the benchmark,
    by speedup, on its hardware's board); "audited" is the rank among verified kernels (every run passed every
    stage), the one GET /v1/leaderboard/{problem}?sound_only=true shows. Both come from app.leaderboard.ranking."""

    problem: str
    submission_id: str
    submitter: str
    board: WebhookBoard
    old_rank: int | None
    new_rank: int | None
    hardware: str | None = None


def refresh_entry(session: Session, audit_id: str) -> list[RankChange]:
    """Write the leaderboard row of the audit's submission (if this is its latest finished audit) and re-rank the
    problem. Returns every rank that moved (the submission's own, and the ones it pushed), empty when nothing did.

    Serialised per problem by a row lock on the problem (Postgres), so two audits finishing at once cannot rank from
    stale snapshots; SQLite serialises writers itself."""
    problem = _write_entry(session, audit_id)
    return [] if problem is None else rerank(session, problem)


def rebuild(session: Session) -> int:
    """Every submission's row from its latest finished audit, then every problem re-ranked (the migration's backfill)."""
    latest = (
        select(Audit.submission_id, func.max(Audit.attempt).label("attempt"))
        .where(Audit.status.in_(FINISHED))
        .group_by(Audit.submission_id)
        .subquery()
    )
    ids = session.scalars(
        select(Audit.id).join(
            latest, (latest.c.submission_id == Audit.submission_id) & (latest.c.attempt == Audit.attempt)
        )
    ).all()
    problems = {p for p in (_write_entry(session, i) for i in ids) if p is not None}
    for p in sorted(problems):
        rerank(session, p)
    return len(ids)


def _write_entry(session: Session, audit_id: str) -> str | None:
    head = session.execute(
        select(
            Audit.attempt,
            Audit.status,
            Audit.verdict,
            Audit.finished_at,
            Audit.device,
            Submission.id,
            Submission.problem_name,
            Submission.submitter,
            Submission.solution_name,
            Submission.source,
        )
        .join(Submission, Submission.id == Audit.submission_id)
        .where(Audit.id == audit_id)
    ).one_or_none()
    if head is None or head.status not in FINISHED:
        return None
    # FOR NO KEY UPDATE: serialises the problem's re-ranking without blocking inserts that reference the problem
    session.execute(select(Problem.name).where(Problem.name == head.problem_name).with_for_update(key_share=True))
    entry = session.get(LeaderboardEntry, head.id, populate_existing=True)
    if entry is not None and entry.attempt > head.attempt:
        return None  # an older attempt finishing late (the reaper) does not replace a newer result
    stages = {
        r.name: r
        for r in session.execute(
            select(StageResultRow.name, StageResultRow.status, StageResultRow.metrics, StageResultRow.position).where(
                StageResultRow.audit_id == audit_id
            )
        )
    }
    values = dict(
        audit_id=audit_id,
        attempt=head.attempt,
        problem_name=head.problem_name,
        submitter=head.submitter,
        solution_name=head.solution_name,
        status=head.status,
        verdict=head.verdict,
        finished_at=head.finished_at,
        kernel_hash=identity.kernel_hash(head.source if isinstance(head.source, dict) else {}),
        hardware=_hardware(session, audit_id, head.device, stages.get("benchmark")),
        **_from_stages(stages),
    )
    if entry is None:
        session.add(LeaderboardEntry(submission_id=head.id, **values))
    else:
        for k, v in values.items():
            setattr(entry, k, v)
    session.flush()
    return str(head.problem_name)


def _hardware(session: Session, audit_id: str, device: str | None, bench: Row[Any] | None) -> str:
    metrics = bench.metrics if bench is not None and isinstance(bench.metrics, dict) else {}
    evidence: dict[str, Any] = {}
    timing = metrics.get("timing")
    if (device or "cpu").startswith("cuda") and not (isinstance(timing, dict) and timing.get("hardware")):
        # an audit from before the stage recorded its GPU's name: the trace environment in its evidence has it
        found = session.scalar(
            select(StageResultRow.evidence).where(
                StageResultRow.audit_id == audit_id, StageResultRow.name == "benchmark"
            )
        )
        evidence = found if isinstance(found, dict) else {}
    return identity.hardware(device, metrics, evidence)


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) else None


def _from_stages(stages: dict[str, Row[Any]]) -> dict[str, Any]:
    """The numbers and judgements the boards rank by, from the audit's stage rows (its statuses are read from them too:
    `stage_statuses`)."""
    bench, probes, verdict = stages.get("benchmark"), stages.get("probes"), stages.get("verdict")
    vm = verdict.metrics if verdict is not None else {}
    passes = vm.get("passes_benchmark")
    if passes is None and bench is not None:
        passes = bench.status == "passed"
    # sound only if the probes ran: skipped probes say nothing either way
    sound = None if probes is None or probes.status == "skipped" else vm.get("numerically_sound")
    if sound is None and probes is not None and probes.status != "skipped":
        sound = probes.status == "passed"
    bm = bench.metrics if bench is not None and isinstance(bench.metrics, dict) else {}
    timing = bm.get("timing") if isinstance(bm.get("timing"), dict) else {}
    kernel, ref = _finite(bm.get("kernel_median_ms")), _finite(bm.get("reference_median_ms"))
    speedup = _finite(bm.get("speedup")) or (ref / kernel if kernel and ref else None)
    ci = bm.get("speedup_ci") or timing.get("speedup_ci")
    lo, hi = (_finite(ci[0]), _finite(ci[1])) if isinstance(ci, list) and len(ci) == 2 else (None, None)
    indicative = bm.get("indicative", timing.get("indicative"))
    # the verdict's own list where it has one (failures only: an error is inconclusive, never a catch)
    caught = (
        list(vm.get("caught_by") or [])
        if "caught_by" in vm
        else [
            s.name
            for s in sorted(stages.values(), key=lambda r: r.position)
            if s.name != "verdict" and s.status in FAILING
        ]
    )
    return dict(
        kernel_ms=kernel,
        reference_ms=ref,
        speedup=speedup,
        speedup_lo=lo,
        speedup_hi=hi,
        indicative=indicative if isinstance(indicative, bool) else None,
        passes_benchmark=passes,
        numerically_sound=sound,
        caught_by=caught[0] if caught else None,
    )


# ---------------------------------------------------------------- ranks


def _run(e: LeaderboardEntry, submitted_at: datetime, stages: dict[str, StageStatus]) -> Run:
    return Run(
        submission_id=e.submission_id,
        submitter=e.submitter,
        solution_name=e.solution_name,
        submitted_at=submitted_at,
        finished_at=e.finished_at,
        # a row written before hashes were kept is its own kernel until it is rewritten
        kernel_hash=e.kernel_hash or f"submission:{e.submission_id}",
        hardware=e.hardware or "unknown",
        status=e.status,
        verdict=e.verdict,
        passes_benchmark=e.passes_benchmark,
        numerically_sound=e.numerically_sound,
        caught_by=e.caught_by,
        kernel_ms=e.kernel_ms,
        reference_ms=e.reference_ms,
        speedup=e.speedup,
        speedup_lo=e.speedup_lo,
        speedup_hi=e.speedup_hi,
        indicative=bool(e.indicative) or e.hardware == identity.CPU,
        stages=stages,
    )


def rerank(session: Session, problem: str) -> list[RankChange]:
    """Recompute the problem's boards with app.leaderboard.ranking; only rows whose values moved are written."""
    rows = session.execute(
        select(LeaderboardEntry, Submission.created_at)
        .join(Submission, Submission.id == LeaderboardEntry.submission_id)
        .where(LeaderboardEntry.problem_name == problem)
    ).all()
    # every stage's status from the stored results, whichever stages the registry had (no column per stage)
    stages = stage_statuses(session, select(LeaderboardEntry.audit_id).where(LeaderboardEntry.problem_name == problem))
    placed: dict[str, dict[Board, Entry]] = {}  # an entry's submission -> its entry on each board
    folded: dict[str, str] = {}  # a folded run -> the submission whose entry shows it
    for (board, _), entries in rank_boards(_run(e, created, stages.get(e.audit_id, {})) for e, created in rows).items():
        for entry in entries:
            placed.setdefault(entry.submission_id, {})[board] = entry
            folded.update({sid: entry.submission_id for sid in entry.submission_ids[1:]})
    changes: list[RankChange] = []
    for e, _ in rows:
        mine = placed.get(e.submission_id, {})
        bench, audited = mine.get("benchmark"), mine.get("audited")
        new_rank, new_sound = (bench.rank if bench else None), (audited.rank if audited else None)
        for board, old_rank, new_rank_ in (
            (_WEBHOOK_BOARD["benchmark"], e.rank, new_rank),
            (_WEBHOOK_BOARD["audited"], e.audited_rank, new_sound),
        ):
            if old_rank != new_rank_:
                changes.append(
                    RankChange(
                        problem=problem,
                        submission_id=e.submission_id,
                        submitter=e.submitter,
                        board=board,
                        old_rank=old_rank,
                        new_rank=new_rank_,
                        hardware=e.hardware,
                    )
                )
        e.rank = e.benchmark_rank = new_rank
        e.sound_rank = e.audited_rank = new_sound
        e.position, e.sound_position = (bench.position if bench else None), (audited.position if audited else None)
        e.runs = bench.runs if bench else None
        e.folded_into = folded.get(e.submission_id)
        e.row_json, e.sound_row_json = _serialised(bench), _serialised(audited)
    session.flush()
    return changes


def _serialised(entry: Entry | None) -> str | None:
    """The entry as GET /v1/leaderboard returns it, stored so that a GET joins strings and builds no objects."""
    if entry is None:
        return None
    return row_of(entry).model_dump_json()


def row_of(entry: Entry) -> LeaderboardRow:
    return LeaderboardRow(
        rank=entry.rank,
        tied=entry.tied,
        hardware=entry.hardware,
        submitter=entry.submitter,
        submission_id=entry.submission_id,
        solution_name=entry.solution_name,
        kernel_ms=entry.kernel_ms,
        reference_ms=entry.reference_ms,
        speedup=entry.speedup,
        speedup_ci=[entry.speedup_lo, entry.speedup_hi],
        runs=entry.runs,
        submission_ids=entry.submission_ids,
        passes_benchmark=True,
        numerically_sound=entry.numerically_sound,
        verdict=entry.verdict,
        caught_by=entry.caught_by,
        indicative=entry.indicative,
        audited_at=entry.audited_at,
        stages=entry.stages,
    )
