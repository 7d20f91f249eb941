"""Per problem: each submitter's best submission that passes the benchmark, ranked by kernel time.

Read from `leaderboard_entries` (app.leaderboard.repository), where the ranks were computed, and each ranked row
serialised, when the audit finished: a GET is one index range scan and a join of strings. numerically_sound says
whether the probes agree; a fast kernel that the benchmark passes but the probes fail is shown, marked, not hidden."""

from __future__ import annotations

from pydantic import TypeAdapter
from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from app.leaderboard.schemas import Leaderboard
from app.models import LeaderboardEntry as E

_NAME = TypeAdapter(str)
# one statement per board, built once: an index range scan on (problem_name, rank)
_ROWS = {
    sound_only: select(body).where(E.problem_name == bindparam("problem"), rank.is_not(None)).order_by(rank)
    for sound_only, rank, body in ((False, E.rank, E.row_json), (True, E.sound_rank, E.sound_row_json))
}


def leaderboard_json(session: Session, problem: str, sound_only: bool = False) -> bytes:
    """The body of GET /v1/leaderboard/{problem}: a `Leaderboard`, serialised."""
    rows = session.connection().execute(_ROWS[sound_only], {"problem": problem}).scalars().all()
    return b'{"problem":' + _NAME.dump_json(problem) + b',"rows":[' + ",".join(rows).encode() + b"]}"


def leaderboard(session: Session, problem: str, sound_only: bool = False) -> Leaderboard:
    return Leaderboard.model_validate_json(leaderboard_json(session, problem, sound_only))
