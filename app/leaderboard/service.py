"""Per problem: each submitter's best submission that passes the benchmark, ranked by kernel time.

Read from `leaderboard_entries` (app.leaderboard.repository), where the ranks were computed when the audit
finished. numerically_sound says whether the probes agree; a fast kernel that the benchmark passes but the
probes fail is shown, marked, not hidden."""

from __future__ import annotations

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from app.leaderboard.schemas import Leaderboard, LeaderboardRow
from app.models import LeaderboardEntry as E

_COLUMNS = (E.submitter, E.submission_id, E.solution_name, E.kernel_ms, E.reference_ms, E.speedup, E.passes_benchmark,
            E.numerically_sound, E.verdict, E.finished_at)
# one statement per board, built once: an index range scan on (problem_name, rank)
_BY_RANK = {
    sound_only: select(rank, *_COLUMNS).where(E.problem_name == bindparam("problem"), rank.is_not(None)).order_by(rank)
    for sound_only, rank in ((False, E.rank), (True, E.sound_rank))
}


def leaderboard(session: Session, problem: str, sound_only: bool = False) -> Leaderboard:
    # Core execution on the session's connection: the statement selects columns, the ORM has nothing to add
    rows = session.connection().execute(_BY_RANK[sound_only], {"problem": problem}).all()
    return Leaderboard(problem=problem, rows=[
        LeaderboardRow(rank=r[0], submitter=r[1], submission_id=r[2], solution_name=r[3], kernel_ms=r[4], reference_ms=r[5],
                       speedup=r[6], passes_benchmark=r[7], numerically_sound=r[8], verdict=r[9], audited_at=r[10])
        for r in rows])
