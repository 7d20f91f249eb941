from __future__ import annotations

from fastapi import APIRouter, HTTPException, Response
from starlette.concurrency import run_in_threadpool

from app.api.deps import Services, ServicesDep
from app.leaderboard.schemas import Leaderboard
from app.leaderboard.service import leaderboard_json

router = APIRouter(prefix="/v1/leaderboard", tags=["leaderboard"])


def _render(services: Services, problem: str, sound_only: bool) -> bytes:
    with services.sessions() as session:
        # a read of committed rows: no BEGIN/ROLLBACK round trips
        session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
        if problem not in services.problems.get(session):
            raise HTTPException(404, f"unknown problem '{problem}'")
        return leaderboard_json(session, problem, sound_only)


@router.get("/{problem}", response_model=Leaderboard, responses={404: {"description": "unknown problem"}})
async def get_leaderboard(problem: str, services: ServicesDep, sound_only: bool = False) -> Response:
    """Best benchmark-passing submission per submitter, fastest first, with whether the probes found it sound.

    Read from the leaderboard table, written in the transaction that finishes each audit; served from a per-process
    cache at most `KAUDIT_LEADERBOARD_CACHE_S` (default 2 s) old, 0 for none."""
    cache = services.leaderboards
    body = cache.get((problem, sound_only))
    if body is None:
        body = await run_in_threadpool(_render, services, problem, sound_only)
        cache.put((problem, sound_only), body)
    return Response(content=body, media_type="application/json")
