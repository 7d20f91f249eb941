from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Request
from sqlalchemy.orm import Session

from app.auth.dependencies import Principal, get_session, require_admin
from app.problems import service
from app.problems.schemas import ProblemDetail, ProblemSummary, SyncResult

router = APIRouter(prefix="/v1/problems", tags=["problems"])


@router.get("", response_model=list[ProblemSummary])
def list_problems(session: Session = Depends(get_session)) -> list[ProblemSummary]:
    """Every problem in the catalogue."""
    return service.list_problems(session)


@router.get("/{name}", response_model=ProblemDetail, responses={404: {"description": "unknown problem"}})
def get_problem(name: str, request: Request, session: Session = Depends(get_session)) -> ProblemDetail:
    """One problem, with its SOL-ExecBench definition."""
    detail = service.get_problem(session, name) if name in request.app.state.problems.get(session) else None
    if detail is None:
        raise HTTPException(404, f"unknown problem '{name}'")
    return detail


@router.post("/sync", response_model=SyncResult, responses={403: {"description": "admin only"}})
def sync_problems(request: Request, _admin: Principal = Depends(require_admin), session: Session = Depends(get_session)) -> SyncResult:
    """Reload the catalogue (admin); every stored submission of a changed problem is re-audited."""
    from worker.catalogue import DEFAULT_ROOT, load_catalogue

    settings = request.app.state.settings
    result, new_audits = service.sync_catalogue(session, load_catalogue(settings.catalogue_root or DEFAULT_ROOT), settings)
    session.commit()
    request.app.state.problems.invalidate()
    for a in new_audits:
        request.app.state.queue.send(a.id, a.queue)
    return result
