from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response

from app.api.deps import ServicesDep
from app.leaderboard.schemas import Leaderboard
from app.leaderboard.service import leaderboard_json

router = APIRouter(prefix="/v1/leaderboard", tags=["leaderboard"])


@router.get("/{problem}", response_model=Leaderboard, responses={404: {"description": "unknown problem"}})
def get_leaderboard(
    problem: str,
    services: ServicesDep,
    sound_only: bool = False,
    hardware: Annotated[str | None, Query(max_length=200, description="one board: cpu, or a GPU's name")] = None,
) -> Response:
    """Every kernel that passes the benchmark, by speedup, one board per hardware (each row names its board), with
    identical kernels folded into one entry (runs, and an interval covering them) and tied ranks where intervals
    overlap (app.leaderboard.ranking). sound_only=true: verified kernels only (every run passed every stage).

    Read on every request from the leaderboard table, which is written in the transaction that finishes each audit:
    never stale, and no response cache."""
    with services.sessions() as session:
        # a read of committed rows: no BEGIN/ROLLBACK round trips
        session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
        if problem not in services.problems.get(session):
            raise HTTPException(404, f"unknown problem '{problem}'")
        body = leaderboard_json(session, problem, sound_only, hardware)
    return Response(content=body, media_type="application/json")
