"""Per problem: each submitter's best submission that passes the benchmark, ranked by kernel time.

numerically_sound says whether the probes agree; a fast kernel that the benchmark passes but the
probes fail is shown, marked, not hidden."""

from __future__ import annotations

import math

from sqlalchemy import Select, and_, bindparam, func, select
from sqlalchemy.orm import Session, aliased

from app.leaderboard.schemas import Leaderboard, LeaderboardRow
from app.models import FINISHED, Audit, StageResultRow, Submission


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _statement() -> Select:  # type: ignore[type-arg]
    """One row per submission's latest finished audit; the few numbers needed are pulled out of the stages' JSON
    by the database. Built once: composing it costs more than running it."""
    latest = (select(Audit.submission_id, func.max(Audit.attempt).label("attempt"))
              .join(Submission, Submission.id == Audit.submission_id)
              .where(Submission.problem_name == bindparam("problem"), Audit.status.in_(FINISHED))
              .group_by(Audit.submission_id).subquery())
    bench, probes, verdict = aliased(StageResultRow), aliased(StageResultRow), aliased(StageResultRow)
    return (
        select(Submission.id, Submission.submitter, Submission.solution_name, Audit.verdict, Audit.finished_at,
               bench.status, bench.metrics["kernel_median_ms"].as_float(), bench.metrics["reference_median_ms"].as_float(),
               bench.metrics["speedup"].as_float(), probes.status,
               verdict.metrics["passes_benchmark"].as_boolean(), verdict.metrics["numerically_sound"].as_boolean())
        .join(latest, latest.c.submission_id == Submission.id)
        .join(Audit, and_(Audit.submission_id == Submission.id, Audit.attempt == latest.c.attempt))
        .outerjoin(bench, and_(bench.audit_id == Audit.id, bench.name == "benchmark"))
        .outerjoin(probes, and_(probes.audit_id == Audit.id, probes.name == "probes"))
        .outerjoin(verdict, and_(verdict.audit_id == Audit.id, verdict.name == "verdict"))
    )


_LEADERBOARD = _statement()


def leaderboard(session: Session, problem: str, sound_only: bool = False) -> Leaderboard:
    rows = session.execute(_LEADERBOARD, {"problem": problem}).all()
    best: dict[str, LeaderboardRow] = {}
    for sid, submitter, sname, audit_verdict, finished, bench_status, kernel, ref, speedup, probes_status, passes, sound in rows:
        if passes is None and bench_status is not None:
            passes = bench_status == "passed"
        # sound only if the probes ran: skipped probes say nothing either way
        if probes_status in (None, "skipped"):
            sound = None
        elif sound is None:
            sound = probes_status == "passed"
        if passes is not True or (sound_only and sound is not True):
            continue
        kernel, ref = _finite(kernel), _finite(ref)
        speedup = _finite(speedup) or (ref / kernel if kernel and ref else None)
        row = LeaderboardRow(rank=0, submitter=submitter, submission_id=sid, solution_name=sname, kernel_ms=kernel,
                             reference_ms=ref, speedup=speedup, passes_benchmark=True, numerically_sound=sound,
                             verdict=audit_verdict, audited_at=finished)
        cur = best.get(submitter)
        if cur is None or _key(row) < _key(cur):
            best[submitter] = row
    ranked = sorted(best.values(), key=_key)
    for i, r in enumerate(ranked, start=1):
        r.rank = i
    return Leaderboard(problem=problem, rows=ranked)


def _key(r: LeaderboardRow) -> tuple[float, str]:
    return (r.kernel_ms if r.kernel_ms is not None else math.inf, r.submission_id)
