from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response

from app.api.deps import ServicesDep, SessionDep, UnitOfWorkDep
from app.auth.dependencies import AdminDep, PrincipalDep, get_principal
from app.auth.principal import Principal
from app.auth.readers import require_reader
from app.core.errors import ApiError, ErrorBody
from app.models import Problem
from app.problems import access, service
from app.problems.namespaces import ORIGIN_CATALOGUE
from app.problems.schemas import DatasetImport, DatasetImported, ProblemDetail, ProblemSummary, SyncResult

router = APIRouter(prefix="/v1/problems", tags=["problems"])
NOT_FOUND = {404: {"model": ErrorBody, "description": "unknown problem (or one this caller may not see)"}}


async def get_viewer(
    request: Request, services: ServicesDep, reader: Annotated[Principal | None, Depends(require_reader)]
) -> Principal | None:
    """The caller, if it sent an API key (reads are public unless KAUDIT_PUBLIC_READ=false): uploads are private
    to their owner and admins, so who asks decides what is listed."""
    if reader is not None:
        return reader
    has_key = request.headers.get("authorization", "").lower().startswith("bearer ") or request.headers.get("x-api-key")
    return await get_principal(request, services) if has_key else None


ViewerDep = Annotated[Principal | None, Depends(get_viewer)]


def _found(session: SessionDep, viewer: Principal | None, name: str) -> Problem:
    row = access.find(session, viewer, name)
    if row is None:
        raise ApiError(404, f"unknown problem '{name[:200]}'")
    return row


@router.get("", response_model=list[ProblemSummary])
def list_problems(session: SessionDep, viewer: ViewerDep) -> list[ProblemSummary]:
    """The catalogue and published uploads; with an API key, also its own private uploads (an admin's: every upload)."""
    return service.list_problems(session, viewer)


@router.get("/{name}", response_model=ProblemDetail, responses=NOT_FOUND)
def get_problem(name: str, session: SessionDep, viewer: ViewerDep) -> ProblemDetail:
    """One problem, with its SOL-ExecBench definition. `name` is its address; a bare definition name the catalogue
    does not have also finds the caller's own upload of that name."""
    return service.detail(_found(session, viewer, name))


@router.post("/sync", response_model=SyncResult, responses={403: {"description": "admin only"}})
def sync_problems(_admin: AdminDep, services: ServicesDep, uow: UnitOfWorkDep) -> SyncResult:
    """Reload the catalogue (admin); every stored submission of a changed problem is re-audited."""
    result = service.sync_and_enqueue(uow, services.settings)
    services.problems.invalidate()
    return result


@router.post(
    "/import",
    response_model=DatasetImported,
    responses={
        403: {"description": "admin only"},
        422: {"model": ErrorBody, "description": "bad path"},
        409: {"model": ErrorBody, "description": "no writable catalogue folder is configured"},
    },
)
def import_problems(
    body: DatasetImport, _admin: AdminDep, services: ServicesDep, uow: UnitOfWorkDep
) -> DatasetImported:
    """Load a SOL-ExecBench dataset tree on this server's disk into the catalogue (admin), then sync: every definition
    folder with its workloads and safetensors blobs (paths leaving the dataset root are refused). Imported references
    are third-party code and run sandboxed until reviewed (worker.dataset_import)."""
    from worker.dataset_import import import_dataset

    dest = services.settings.catalogue_root
    if dest is None:
        raise ApiError(409, "no catalogue folder is configured: set KAUDIT_CATALOGUE_ROOT to a writable folder")
    root = Path(body.path)
    if not root.is_absolute() or not root.is_dir():
        raise ApiError(422, f"'{body.path[:200]}' is not an absolute path to a folder on this server")
    if (
        root.resolve() == dest.resolve()
        or dest.resolve() in root.resolve().parents
        or root.resolve() in dest.resolve().parents
    ):
        raise ApiError(422, "the dataset and the catalogue folder overlap")
    report = import_dataset(root, dest)
    synced = service.sync_and_enqueue(uow, services.settings) if report.imported else None
    services.problems.invalidate()
    return DatasetImported(report=report.model_dump(), sync=synced)


@router.post(
    "/{name}/publish", response_model=ProblemDetail, responses={403: {"description": "admin only"}, **NOT_FOUND}
)
def publish(name: str, admin: AdminDep, services: ServicesDep, uow: UnitOfWorkDep) -> ProblemDetail:
    """Make an uploaded problem public (admin): listed for everyone, on the dashboard, and open to every submitter."""
    row = _found(uow.session, admin, name)
    row.public = True
    uow.session.flush()
    services.problems.invalidate()
    return service.detail(row)


@router.post(
    "/{name}/unpublish",
    response_model=ProblemDetail,
    responses={
        403: {"description": "admin only"},
        409: {"model": ErrorBody, "description": "a catalogue problem"},
        **NOT_FOUND,
    },
)
def unpublish(name: str, admin: AdminDep, services: ServicesDep, uow: UnitOfWorkDep) -> ProblemDetail:
    """Make an uploaded problem private again (admin): only its owner and admins see it."""
    row = _found(uow.session, admin, name)
    if row.origin == ORIGIN_CATALOGUE:
        raise ApiError(409, f"'{row.name}' is a catalogue problem, and catalogue problems are always public")
    row.public = False
    uow.session.flush()
    services.problems.invalidate()
    return service.detail(row)


@router.delete(
    "/{name}",
    status_code=204,
    responses={
        403: {"model": ErrorBody, "description": "a published upload that is not the caller's"},
        409: {"model": ErrorBody, "description": "a catalogue problem, or audits of it are queued or running"},
        **NOT_FOUND,
    },
)
def delete(name: str, principal: PrincipalDep, services: ServicesDep, uow: UnitOfWorkDep) -> Response:
    """Delete an uploaded problem (its owner, or an admin). Refused while audits of it are queued or running. Its
    submissions and their results are kept and stay readable by their submitters; the problem is listed, found and
    audited against no more."""
    row = _found(uow.session, principal, name)
    if row.origin == ORIGIN_CATALOGUE:
        raise ApiError(
            409,
            f"'{row.name}' is a catalogue problem: it goes when it leaves the catalogue (kernels/), not by a DELETE",
        )
    if not access.may_manage(row, principal):
        raise ApiError(403, "only the API key that uploaded this problem, or an admin, may delete it")
    try:
        service.delete_upload(uow.session, row)
    except service.ProblemBusy as err:
        raise ApiError(409, str(err)) from err
    services.problems.invalidate()
    return Response(status_code=204)
