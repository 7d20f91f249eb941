from __future__ import annotations

from fastapi import APIRouter, Response

from app.api.deps import ServicesDep, UnitOfWorkDep
from app.auth.dependencies import PrincipalDep
from app.definitions import service
from app.definitions.schemas import DefinitionStored
from worker.formats.bundle import DefinitionBundle

router = APIRouter(prefix="/v1/definitions", tags=["definitions"])


@router.post(
    "",
    status_code=201,
    response_model=DefinitionStored,
    responses={
        200: {"description": "this exact definition was already stored"},
        403: {"description": "this deployment audits its curated catalogue only"},
        409: {"description": "you already uploaded another definition under this name"},
        422: {
            "description": "the definition or its workloads are invalid, or cannot be stored as sent "
            "(a name too long, NUL characters or lone surrogates)"
        },
    },
)
def upload_definition(
    bundle: DefinitionBundle, principal: PrincipalDep, services: ServicesDep, uow: UnitOfWorkDep, response: Response
) -> DefinitionStored:
    """Upload a SOL-ExecBench definition with its workloads (as `{definition, workloads, workloads_cpu?}`).

    It is stored in your key's namespace, at `<definition name>@<namespace>` (never a catalogue name), and is private
    (you and admins) until an admin publishes it. Solutions name that address, or the bare name where the catalogue
    has no problem of that name. Its reference is the uploader's code: it runs isolated, like a kernel, and the
    audits of its solutions are judged against it."""
    row, created = service.store_definition(uow, services, principal, bundle)
    if not created:
        response.status_code = 200
    return DefinitionStored(
        name=row.name,
        definition_name=bundle.definition.name,
        namespace=row.namespace,
        content_hash=row.content_hash,
        origin=row.origin,
        public=row.public,
        created=created,
        problem_url=f"/v1/problems/{row.name}",
    )
