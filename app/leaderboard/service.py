"""Per problem and hardware: every kernel that passes the benchmark, ranked by speedup (app.leaderboard.ranking).

Read from `leaderboard_entries` (app.leaderboard.repository), where the ranks were computed, and each entry
serialised, when the audit finished: a GET is one index range scan and a join of strings. numerically_sound says
whether the probes agree; a fast kernel that the benchmark passes but an audit stage catches is shown, marked
(verdict fail), not hidden; sound_only=true reads the audited board instead, verified kernels only."""

from __future__ import annotations

from pydantic import TypeAdapter
from sqlalchemy import Select, bindparam, select
from sqlalchemy.orm import Session

from app.leaderboard.identity import CPU
from app.leaderboard.schemas import Leaderboard
from app.models import LeaderboardEntry as E

_NAME = TypeAdapter(str)


def _statement(sound_only: bool, one_hardware: bool) -> Select[tuple[str | None]]:
    rank, body, position = (
        (E.sound_rank, E.sound_row_json, E.sound_position) if sound_only else (E.rank, E.row_json, E.position)
    )
    stmt = select(body).where(E.problem_name == bindparam("problem"), rank.is_not(None))
    if one_hardware:
        stmt = stmt.where(E.hardware == bindparam("hardware"))
    # GPU boards first, the CPU's (indicative figures) last; rows in board order
    return stmt.order_by(E.hardware == CPU, E.hardware, position)


# one statement per board and filter, built once: an index range scan on (problem_name, rank)
_ROWS = {(sound_only, one): _statement(sound_only, one) for sound_only in (False, True) for one in (False, True)}


def leaderboard_json(session: Session, problem: str, sound_only: bool = False, hardware: str | None = None) -> bytes:
    """The body of GET /v1/leaderboard/{problem}: a `Leaderboard`, serialised; every hardware's board, in turn,
    unless `hardware` names one."""
    params = {"problem": problem} | ({"hardware": hardware} if hardware is not None else {})
    rows = session.connection().execute(_ROWS[(sound_only, hardware is not None)], params).scalars().all()
    return b'{"problem":' + _NAME.dump_json(problem) + b',"rows":[' + ",".join(r for r in rows if r).encode() + b"]}"


def leaderboard(session: Session, problem: str, sound_only: bool = False, hardware: str | None = None) -> Leaderboard:
    return Leaderboard.model_validate_json(leaderboard_json(session, problem, sound_only, hardware))
