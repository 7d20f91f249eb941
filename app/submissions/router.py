from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Response
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session

from app.api.deps import ServicesDep, SessionDep, UnitOfWorkDep
from app.auth.dependencies import AdminDep, PrincipalDep
from app.auth.principal import Principal
from app.submissions import repository, service
from app.submissions.devices import NoDeviceForSolution, choose_device
from app.submissions.parsing import SubmissionBody
from app.submissions.schemas import (
    FieldError,
    InvalidSolution,
    SubmissionAccepted,
    SubmissionStatus,
)

router = APIRouter(prefix="/v1/submissions", tags=["submissions"])
_ID = re.compile(r"[0-9a-f]{32}")

SUBMIT_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/Solution"}},
            "multipart/form-data": {"schema": {
                "type": "object",
                "required": ["file", "definition"],
                "properties": {
                    "file": {"type": "string", "format": "binary", "description": "a single .py file with a `run` function"},
                    "definition": {"type": "string", "description": "definition name, see GET /v1/problems"},
                    "entry_function": {"type": "string", "default": "run"},
                    "destination_passing_style": {"type": "boolean", "default": True},
                },
            }},
        },
    }
}


def invalid_response(errors: list[FieldError]) -> JSONResponse:
    return JSONResponse(status_code=422, content=InvalidSolution(detail="invalid solution", errors=errors).model_dump())


def _accepted(acc: service.Accepted) -> JSONResponse:
    url = f"/v1/submissions/{acc.submission_id}"
    body = SubmissionAccepted(id=acc.submission_id, audit_id=acc.audit_id, status=acc.status, status_url=url,  # type: ignore[arg-type]
                              queue_position=acc.queue_position, idempotent_replay=acc.replay)
    return JSONResponse(status_code=202, content=body.model_dump(mode="json"), headers={"Location": url})


@router.post(
    "",
    status_code=202,
    response_model=SubmissionAccepted,
    openapi_extra=SUBMIT_BODY,
    responses={404: {"description": "unknown definition"}, 409: {"description": "Idempotency-Key reused with another body"},
               413: {"description": "body over 1 MiB"}, 415: {"description": "unsupported content type"},
               422: {"model": InvalidSolution, "description": "invalid solution: each field and the reason"},
               429: {"description": "rate limit; see Retry-After"}},
)
def submit(
    principal: PrincipalDep,
    body: SubmissionBody,
    services: ServicesDep,
    uow: UnitOfWorkDep,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=200, pattern=r"^[\x20-\x7e]+$")] = None,
) -> Response:
    """Submit a solution.json (JSON body) or a single .py file (multipart, with `definition`): 202 with the status URL."""
    solution, data = body.solution, body.data
    try:
        device = choose_device(solution, services.settings)
    except NoDeviceForSolution as err:
        return invalid_response([FieldError(field="spec.target_hardware", reason=str(err))])
    known = services.problems.get(uow.session)
    if solution.definition not in known:
        raise HTTPException(404, f"unknown definition '{solution.definition}'; known: {', '.join(sorted(known))}")
    try:
        acc = service.submit(uow, services.settings, principal, problem_name=solution.definition,
                             problem_hash=known[solution.definition], solution_name=solution.name, data=data,
                             idempotency_key=idempotency_key, device=device)
    except service.IdempotencyConflict as err:
        raise HTTPException(409, str(err)) from err
    return _accepted(acc)


def _visible(session: Session, submission_id: str, principal: Principal):  # type: ignore[no-untyped-def]
    sub = repository.get(session, submission_id) if _ID.fullmatch(submission_id) else None
    if sub is None or (sub.api_key_id != principal.key_id and not principal.is_admin):
        raise HTTPException(404, f"no submission '{submission_id}'")
    return sub


@router.get("/{submission_id}", response_model=SubmissionStatus, responses={404: {"description": "no such submission"}})
def get_submission(submission_id: str, principal: PrincipalDep, session: SessionDep) -> SubmissionStatus:
    """Status of the latest audit, and every finished stage with its summary, metrics and evidence."""
    return service.status(session, _visible(session, submission_id, principal))


@router.post("/{submission_id}/reaudit", status_code=202, response_model=SubmissionAccepted,
             responses={403: {"description": "admin only"}, 404: {"description": "no such submission"}})
def reaudit(submission_id: str, principal: AdminDep, services: ServicesDep, uow: UnitOfWorkDep) -> Response:
    """Audit a stored submission again, with a fresh secret seed (admin)."""
    sub = _visible(uow.session, submission_id, principal)
    known = services.problems.get(uow.session)
    if sub.problem_name not in known:
        raise HTTPException(404, f"problem '{sub.problem_name}' is no longer in the catalogue")
    return _accepted(service.reaudit(uow, services.settings, sub, known[sub.problem_name]))
