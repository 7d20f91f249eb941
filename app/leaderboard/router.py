from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Request
from sqlalchemy.orm import Session

from app.auth.dependencies import get_session
from app.leaderboard.schemas import Leaderboard
from app.leaderboard.service import leaderboard

router = APIRouter(prefix="/v1/leaderboard", tags=["leaderboard"])


@router.get("/{problem}", response_model=Leaderboard, responses={404: {"description": "unknown problem"}})
def get_leaderboard(problem: str, request: Request, sound_only: bool = False, session: Session = Depends(get_session)) -> Leaderboard:
    """Best benchmark-passing submission per submitter, fastest first, with whether the probes found it sound."""
    if problem not in request.app.state.problems.get(session):
        raise HTTPException(404, f"unknown problem '{problem}'")
    return leaderboard(session, problem, sound_only)
