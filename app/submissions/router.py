from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Depends, Header, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session
from starlette.datastructures import UploadFile

from app.auth.dependencies import Principal, get_principal, get_session, require_admin
from app.submissions import repository, service
from app.submissions.devices import NoDeviceForSolution, choose_device
from app.submissions.parsing import (
    InvalidSubmission,
    solution_from_json,
    solution_from_upload,
)
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


def _invalid(errors: list[FieldError]) -> JSONResponse:
    return JSONResponse(status_code=422, content=InvalidSolution(detail="invalid solution", errors=errors).model_dump())


def _accepted(request: Request, acc: service.Accepted) -> JSONResponse:
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
async def submit(
    request: Request,
    principal: Principal = Depends(get_principal),
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=200, pattern=r"^[\x20-\x7e]+$")] = None,
) -> Response:
    """Submit a solution.json (JSON body) or a single .py file (multipart, with `definition`): 202 with the status URL."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    try:
        if ctype == "application/json" or ctype.endswith("+json"):
            solution, data = solution_from_json(await request.body())
        elif ctype == "multipart/form-data":
            form = await request.form(max_files=1, max_fields=10)
            upload, definition = form.get("file"), form.get("definition")
            if not isinstance(upload, UploadFile):
                raise InvalidSubmission([FieldError(field="file", reason="a .py file upload is required")])
            dps = str(form.get("destination_passing_style", "true")).lower() not in ("false", "0", "no")
            solution, data = solution_from_upload(upload.filename or "", await upload.read(),
                                                  definition if isinstance(definition, str) else "",
                                                  str(form.get("entry_function") or "run"), dps)
        else:
            raise HTTPException(415, "send application/json (solution.json) or multipart/form-data (a .py file and definition)")
        device = choose_device(solution, request.app.state.settings)
    except InvalidSubmission as err:
        return _invalid(err.errors)
    except NoDeviceForSolution as err:
        return _invalid([FieldError(field="spec.target_hardware", reason=str(err))])
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(_store, request, principal, solution.definition, solution.name, data, idempotency_key, device)


def _store(request: Request, principal: Principal, definition: str, name: str, data: dict, idem: str | None,  # type: ignore[type-arg]
           device: str) -> Response:
    state = request.app.state
    with state.sessions() as session:
        known = state.problems.get(session)
        if definition not in known:
            raise HTTPException(404, f"unknown definition '{definition}'; known: {', '.join(sorted(known))}")
        try:
            acc = service.submit(session, state.queue, state.settings, principal, problem_name=definition,
                                 problem_hash=known[definition], solution_name=name, data=data, idempotency_key=idem,
                                 device=device)
        except service.IdempotencyConflict as err:
            raise HTTPException(409, str(err)) from err
        return _accepted(request, acc)


def _visible(session: Session, submission_id: str, principal: Principal):  # type: ignore[no-untyped-def]
    sub = repository.get(session, submission_id) if _ID.fullmatch(submission_id) else None
    if sub is None or (sub.api_key_id != principal.key_id and not principal.is_admin):
        raise HTTPException(404, f"no submission '{submission_id}'")
    return sub


@router.get("/{submission_id}", response_model=SubmissionStatus, responses={404: {"description": "no such submission"}})
def get_submission(submission_id: str, principal: Principal = Depends(get_principal), session: Session = Depends(get_session)) -> SubmissionStatus:
    """Status of the latest audit, and every finished stage with its summary, metrics and evidence."""
    return service.status(session, _visible(session, submission_id, principal))


@router.post("/{submission_id}/reaudit", status_code=202, response_model=SubmissionAccepted,
             responses={403: {"description": "admin only"}, 404: {"description": "no such submission"}})
def reaudit(submission_id: str, request: Request, principal: Principal = Depends(require_admin),
            session: Session = Depends(get_session)) -> Response:
    """Audit a stored submission again, with a fresh secret seed (admin)."""
    sub = _visible(session, submission_id, principal)
    known = request.app.state.problems.get(session)
    if sub.problem_name not in known:
        raise HTTPException(404, f"problem '{sub.problem_name}' is no longer in the catalogue")
    acc = service.reaudit(session, request.app.state.queue, request.app.state.settings, sub, known[sub.problem_name])
    return _accepted(request, acc)
