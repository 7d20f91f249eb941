from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Header, Query, Response
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session

from app.api.deps import ServicesDep, SessionDep, UnitOfWorkDep
from app.audits.status import AuditStatus
from app.auth.dependencies import AdminDep, PrincipalDep
from app.auth.principal import Principal
from app.core.errors import ApiError, error_response
from app.definitions.service import store_definition
from app.models import Problem, Submission
from app.problems import access as problem_access
from app.submissions import repository, service
from app.submissions.cursor import BadCursor
from app.submissions.devices import NoDeviceForSolution, choose_device
from app.submissions.disclosure import Disclosure, disclosure
from app.submissions.parsing import SubmissionBody
from app.submissions.schemas import (
    FieldError,
    InvalidSolution,
    SubmissionAccepted,
    SubmissionPage,
    SubmissionStatus,
    SubmissionTraces,
)
from worker.formats import Solution
from worker.formats.entry_check import check_entry

router = APIRouter(prefix="/v1/submissions", tags=["submissions"])
_ID = re.compile(r"[0-9a-f]{32}")

SUBMIT_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/Solution"}},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "definition"],
                    "properties": {
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "description": "a single .py file with a `run` function",
                        },
                        "definition": {"type": "string", "description": "definition name, see GET /v1/problems"},
                        "entry_function": {"type": "string", "default": "run"},
                        "destination_passing_style": {"type": "boolean", "default": True},
                        "token_stats": {
                            "type": "string",
                            "format": "binary",
                            "description": "optional: your token statistics, a .npy or .safetensors file "
                            "(a histogram or a sample of token ids)",
                        },
                        "token_stats_kind": {
                            "type": "string",
                            "enum": ["auto", "histogram", "sample"],
                            "default": "auto",
                        },
                        "token_stats_key": {"type": "string", "description": "safetensors: the tensor to use"},
                    },
                }
            },
        },
    }
}


def invalid_response(errors: list[FieldError]) -> JSONResponse:
    return error_response(422, "invalid solution", errors)


def _entry_errors(problem: Problem, solution: Solution) -> list[FieldError]:
    """The cheap checks intake would fail on (parse, entry point, arity), answered now rather than after the queue."""
    if solution.spec.is_cpp:
        return []
    inputs, outputs = list(problem.definition.get("inputs", {})), list(problem.definition.get("outputs", {}))
    return [FieldError(field=p.field, reason=p.reason) for p in check_entry(solution, inputs, outputs)]


def _accepted(acc: service.Accepted) -> JSONResponse:
    url = f"/v1/submissions/{acc.submission_id}"
    body = SubmissionAccepted(
        id=acc.submission_id,
        audit_id=acc.audit_id,
        status=acc.status,
        status_url=url,  # type: ignore[arg-type]
        queue_position=acc.queue_position,
        idempotent_replay=acc.replay,
    )
    return JSONResponse(status_code=202, content=body.model_dump(mode="json"), headers={"Location": url})


@router.post(
    "",
    status_code=202,
    response_model=SubmissionAccepted,
    openapi_extra=SUBMIT_BODY,
    responses={
        404: {"model": InvalidSolution, "description": "unknown definition"},
        409: {"model": InvalidSolution, "description": "Idempotency-Key reused with another body"},
        413: {"description": "body over 1 MiB (token_stats not counted), or token_stats over 16 MiB"},
        415: {"description": "unsupported content type"},
        422: {"model": InvalidSolution, "description": "invalid solution or token_stats: each field and the reason"},
        429: {"description": "rate limit; see Retry-After"},
    },
)
def submit(
    principal: PrincipalDep,
    body: SubmissionBody,
    services: ServicesDep,
    uow: UnitOfWorkDep,
    idempotency_key: Annotated[
        str | None, Header(alias="Idempotency-Key", max_length=200, pattern=r"^[\x20-\x7e]+$")
    ] = None,
) -> Response:
    """Submit a solution.json (JSON body) or a single .py file (multipart, with `definition`): 202 with the status URL.

    The checks that need no sandbox (JSON and format, the entry file parses, the entry point exists at its top level
    and takes the definition's arguments) are answered here with 422 and each field at fault.

    Optional token statistics (bring your own distribution): a top-level `token_stats` object in the JSON body,
    `{"kind": "auto"|"histogram"|"sample", "format": "npy"|"safetensors", "data_base64": "...", "key": null}`, or a
    `token_stats` file part in multipart. They are read at once by the engine's own reader (422 naming the field
    otherwise) and every audit of the submission draws its id probes and canary text from them."""
    solution, data = body.solution, body.data
    try:
        device = choose_device(solution, services.settings)
    except NoDeviceForSolution as err:
        return invalid_response([FieldError(field=err.field, reason=str(err))])
    # the definition came with the solution: stored (by content) in this transaction, in the caller's namespace;
    # else the name resolves to a problem this caller may see (app.problems.access)
    problem = (
        store_definition(uow, services, principal, body.bundle)[0]
        if body.bundle is not None
        else problem_access.find(uow.session, principal, solution.definition)
    )
    if problem is None:
        known = problem_access.visible_names(uow.session, principal)
        raise ApiError(
            404,
            f"unknown definition '{solution.definition[:200]}'; known: {', '.join(known)}",
            [FieldError(field="definition", reason="not in the catalogue; see GET /v1/problems")],
        )
    entry_errors = _entry_errors(problem, solution)
    if entry_errors:
        return invalid_response(entry_errors)
    try:
        acc = service.submit(
            uow,
            services.settings,
            principal,
            problem_name=problem.name,
            problem_hash=problem.content_hash,
            solution_name=solution.name,
            data=data,
            idempotency_key=idempotency_key,
            device=device,
            token_stats=body.token_stats,
        )
    except service.IdempotencyConflict as err:
        raise ApiError(409, str(err), [FieldError(field="Idempotency-Key", reason=str(err))]) from err
    return _accepted(acc)


def _visible(session: Session, submission_id: str, principal: Principal) -> Submission:
    """The submission, for a caller who may see its private details (app/submissions/disclosure.py, the rule the
    dashboard follows too); 404 to anyone else: this record is all private detail, and its public part (statuses,
    numbers) is what the leaderboard and the dashboard show."""
    sub = repository.get(session, submission_id) if _ID.fullmatch(submission_id) else None
    if sub is None or disclosure(principal, sub.api_key_id) is not Disclosure.full:
        raise ApiError(404, f"no submission '{submission_id[:64]}'")
    return sub


@router.get(
    "",
    response_model=SubmissionPage,
    responses={422: {"model": InvalidSolution, "description": "bad filter or cursor"}},
)
def list_submissions(
    principal: PrincipalDep,
    session: SessionDep,
    status: Annotated[AuditStatus | None, Query(description="the latest audit's status")] = None,
    problem: Annotated[str | None, Query(max_length=200, description="a definition name")] = None,
    cursor: Annotated[str | None, Query(max_length=200, description="next_cursor from the previous page")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> SubmissionPage:
    """Your submissions (an admin's key: everyone's), newest first, each with its latest audit; filter by status and problem."""
    try:
        return service.list_submissions(session, principal, limit=limit, status=status, problem=problem, cursor=cursor)
    except BadCursor as err:
        raise ApiError(422, "invalid cursor", [FieldError(field="cursor", reason=str(err))]) from err


@router.get("/{submission_id}", response_model=SubmissionStatus, responses={404: {"description": "no such submission"}})
def get_submission(submission_id: str, principal: PrincipalDep, session: SessionDep) -> SubmissionStatus:
    """Status of the latest audit, with every finished stage (summary, metrics, evidence) and, while running, its
    progress (current stage, elapsed times); `attempts` keeps every earlier audit of the submission."""
    return service.status(session, _visible(session, submission_id, principal))


@router.get(
    "/{submission_id}/traces", response_model=SubmissionTraces, responses={404: {"description": "no such submission"}}
)
def get_traces(submission_id: str, principal: PrincipalDep, session: SessionDep) -> SubmissionTraces:
    """What SOL-ExecBench itself would record for the latest audit, one trace per evaluated workload, in the official
    trace schema (status, correctness, performance, environment). kernel-audit's own findings stay in the
    submission's stages; an audit still running, or one that never reached the benchmark, has no traces yet."""
    sub = _visible(session, submission_id, principal)
    return service.traces(session, sub)


@router.post(
    "/{submission_id}/reaudit",
    status_code=202,
    response_model=SubmissionAccepted,
    responses={403: {"description": "admin only"}, 404: {"description": "no such submission"}},
)
def reaudit(submission_id: str, principal: AdminDep, services: ServicesDep, uow: UnitOfWorkDep) -> Response:
    """Audit a stored submission again, with a fresh secret seed (admin)."""
    sub = _visible(uow.session, submission_id, principal)
    known = services.problems.every(uow.session)  # private uploads too: re-audits are an admin's
    if sub.problem_name not in known:
        raise ApiError(404, f"problem '{sub.problem_name}' is no longer in the catalogue")
    return _accepted(service.reaudit(uow, services.settings, sub, known[sub.problem_name]))
