"""One shape for every error answer: `{"detail": str, "errors": [{"field", "reason"}]}`.

FastAPI's own validation errors and every HTTPException are mapped into it, so a client parses one shape.
Reasons are plain (no pydantic "Value error, " prefix) and bounded, so no answer echoes a huge input back.
A dependency that cannot be reached (the database, the broker) is a 503 naming it, with Retry-After: the
client's request was fine and may succeed later. Anything else unexpected is a 500 in the same shape, which
says nothing of the cause (the traceback goes to the server's log, not to the caller)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import kombu.exceptions
import psycopg
import redis.exceptions
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException as StarletteHTTPException

from worker.formats.exceptions import plain_reason

log = logging.getLogger(__name__)

MAX_ERRORS = 20
MAX_REASON_CHARS = 500
BODY = "(body)"
RETRY_AFTER_S = 5
Dependency = Literal["database", "broker"]
# what an unreachable dependency raises: connection refused or reset, unknown database, timed out, pool exhausted
DATABASE_DOWN: tuple[type[Exception], ...] = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.TimeoutError,
    sa_exc.DisconnectionError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
)
BROKER_DOWN: tuple[type[Exception], ...] = (
    kombu.exceptions.OperationalError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
)


class FieldError(BaseModel):
    field: str = Field(description="the offending field, dotted ('spec.entry_point'), a header's name, or '(body)'")
    reason: str


class ErrorBody(BaseModel):
    detail: str
    errors: list[FieldError] = Field(default_factory=list)


class ApiError(Exception):
    """An answer with a status, a one-line detail and the fields at fault."""

    def __init__(
        self, status_code: int, detail: str, errors: Sequence[FieldError] = (), headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.status_code, self.detail, self.errors, self.headers = (
            status_code,
            detail,
            list(errors),
            dict(headers or {}),
        )


def _clip(text: str, limit: int = MAX_REASON_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def error_body(detail: str, errors: Iterable[FieldError] = ()) -> dict[str, Any]:
    """The shape, bounded: at most MAX_ERRORS entries, each reason at most MAX_REASON_CHARS."""
    errors = list(errors)
    kept = [FieldError(field=_clip(e.field, 200), reason=_clip(e.reason)) for e in errors[:MAX_ERRORS]]
    if len(errors) > MAX_ERRORS:
        kept.append(FieldError(field=BODY, reason=f"{len(errors) - MAX_ERRORS} more errors not shown"))
    return ErrorBody(detail=_clip(detail), errors=kept).model_dump()


def error_response(
    status_code: int, detail: str, errors: Iterable[FieldError] = (), headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(status_code=status_code, content=error_body(detail, errors), headers=dict(headers or {}))


def _field(loc: Sequence[int | str]) -> str:
    """('body', 'spec', 'x') -> 'spec.x'; ('header', 'Idempotency-Key') -> 'Idempotency-Key'; ('body',) -> '(body)'."""
    rest = (
        [str(p) for p in loc[1:]]
        if loc and loc[0] in ("body", "header", "query", "path", "cookie")
        else [str(p) for p in loc]
    )
    return ".".join(rest) or BODY


def validation_errors(err: RequestValidationError) -> list[FieldError]:
    out = []
    for e in err.errors():
        if e.get("type") == "json_invalid":  # its loc is ('body', character offset)
            why = (e.get("ctx") or {}).get("error", "")
            out.append(FieldError(field=BODY, reason=f"not valid JSON: {why}" if why else "not valid JSON"))
        else:
            out.append(FieldError(field=_field(e.get("loc", ())), reason=plain_reason(str(e.get("msg", "invalid")))))
    return out


def unreachable(err: BaseException) -> Dependency | None:
    """The dependency this error says is unreachable, if any."""
    if isinstance(err, DATABASE_DOWN) or (isinstance(err, sa_exc.DBAPIError) and err.connection_invalidated):
        return "database"
    if isinstance(err, BROKER_DOWN):
        return "broker"
    return None


def unavailable_response(down: Iterable[Dependency]) -> JSONResponse:
    names = list(down)
    return error_response(
        503,
        f"unavailable: the {' and the '.join(names)} cannot be reached; try again later",
        [FieldError(field=n, reason="unreachable") for n in names],
        {"Retry-After": str(RETRY_AFTER_S)},
    )


def install_error_handlers(app: FastAPI) -> None:
    """Map RequestValidationError, HTTPException, ApiError, an unreachable dependency and any other error into the
    one shape."""

    async def _internal(_request: Request, _err: Exception) -> JSONResponse:
        # registered for Exception: Starlette logs the traceback after this answer is sent
        return error_response(500, "internal server error")

    async def _dependency(request: Request, err: Exception) -> JSONResponse:
        down = unreachable(err)
        if down is None:  # a database error that is not about reaching it (a bug): 500, traceback logged here
            log.error("%s %s failed", request.method, request.url.path, exc_info=err)
            return error_response(500, "internal server error")
        first_line = str(err).splitlines()[0] if str(err) else ""
        log.warning(
            "%s %s: the %s is unreachable: %s: %s",
            request.method,
            request.url.path,
            down,
            type(err).__name__,
            first_line,
        )
        return unavailable_response([down])

    dependency_errors: tuple[type[Exception], ...] = (sa_exc.DBAPIError, *DATABASE_DOWN, *BROKER_DOWN)
    for kind in dependency_errors:
        app.add_exception_handler(kind, _dependency)
    app.add_exception_handler(Exception, _internal)

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, err: ApiError) -> JSONResponse:
        return error_response(err.status_code, err.detail, err.errors, err.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, err: RequestValidationError) -> JSONResponse:
        return error_response(422, "invalid request", validation_errors(err))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, err: StarletteHTTPException) -> JSONResponse:
        detail = err.detail if isinstance(err.detail, str) else str(err.detail)
        return error_response(err.status_code, detail, (), getattr(err, "headers", None))
