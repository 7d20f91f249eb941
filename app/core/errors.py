"""One shape for every 4xx answer: `{"detail": str, "errors": [{"field", "reason"}]}`.

FastAPI's own validation errors and every HTTPException are mapped into it, so a client parses one shape.
Reasons are plain (no pydantic "Value error, " prefix) and bounded, so no answer echoes a huge input back."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from worker.formats.exceptions import plain_reason

MAX_ERRORS = 20
MAX_REASON_CHARS = 500
BODY = "(body)"


class FieldError(BaseModel):
    field: str = Field(description="the offending field, dotted ('spec.entry_point'), a header's name, or '(body)'")
    reason: str


class ErrorBody(BaseModel):
    detail: str
    errors: list[FieldError] = Field(default_factory=list)


class ApiError(Exception):
    """An answer with a status, a one-line detail and the fields at fault."""

    def __init__(self, status_code: int, detail: str, errors: Sequence[FieldError] = (),
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status_code, self.detail, self.errors, self.headers = status_code, detail, list(errors), dict(headers or {})


def _clip(text: str, limit: int = MAX_REASON_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def error_body(detail: str, errors: Iterable[FieldError] = ()) -> dict[str, Any]:
    """The shape, bounded: at most MAX_ERRORS entries, each reason at most MAX_REASON_CHARS."""
    errors = list(errors)
    kept = [FieldError(field=_clip(e.field, 200), reason=_clip(e.reason)) for e in errors[:MAX_ERRORS]]
    if len(errors) > MAX_ERRORS:
        kept.append(FieldError(field=BODY, reason=f"{len(errors) - MAX_ERRORS} more errors not shown"))
    return ErrorBody(detail=_clip(detail), errors=kept).model_dump()


def error_response(status_code: int, detail: str, errors: Iterable[FieldError] = (),
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(status_code=status_code, content=error_body(detail, errors), headers=dict(headers or {}))


def _field(loc: Sequence[int | str]) -> str:
    """('body', 'spec', 'x') -> 'spec.x'; ('header', 'Idempotency-Key') -> 'Idempotency-Key'; ('body',) -> '(body)'."""
    rest = [str(p) for p in loc[1:]] if loc and loc[0] in ("body", "header", "query", "path", "cookie") else [str(p) for p in loc]
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


def install_error_handlers(app: FastAPI) -> None:
    """Map RequestValidationError, HTTPException and ApiError into the one shape."""

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
