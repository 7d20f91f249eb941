from __future__ import annotations

from fastapi import APIRouter, HTTPException

from app.api.deps import ServicesDep, SessionDep, UnitOfWorkDep
from app.auth.dependencies import AdminDep
from app.problems import service
from app.problems.schemas import ProblemDetail, ProblemSummary, SyncResult

router = APIRouter(prefix="/v1/problems", tags=["problems"])


@router.get("", response_model=list[ProblemSummary])
def list_problems(session: SessionDep) -> list[ProblemSummary]:
    """Every problem in the catalogue."""
    return service.list_problems(session)


@router.get("/{name}", response_model=ProblemDetail, responses={404: {"description": "unknown problem"}})
def get_problem(name: str, services: ServicesDep, session: SessionDep) -> ProblemDetail:
    """One problem, with its SOL-ExecBench definition."""
    detail = service.get_problem(session, name) if name in services.problems.get(session) else None
    if detail is None:
        raise HTTPException(404, f"unknown problem '{name}'")
    return detail


@router.post("/sync", response_model=SyncResult, responses={403: {"description": "admin only"}})
def sync_problems(_admin: AdminDep, services: ServicesDep, uow: UnitOfWorkDep) -> SyncResult:
    """Reload the catalogue (admin); every stored submission of a changed problem is re-audited."""
    result = service.sync_and_enqueue(uow, services.settings)
    services.problems.invalidate()
    return result
