"""Turn a request body (solution.json, or a multipart .py upload) into a Solution, or field/reason errors."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request
from starlette.datastructures import UploadFile

from app.core.errors import BODY, ApiError, FieldError
from app.submissions import token_stats as ts
from worker.formats import FormatError, Solution, SolutionSpec, SourceFile
from worker.formats.bundle import DefinitionBundle
from worker.formats.json_bounds import loads_bounded, walk_strings
from worker.formats.loaders import parse_model

_FIELD = re.compile(r"[A-Za-z_][\w.]*")


@dataclass(frozen=True)
class ParsedSubmission:
    solution: Solution
    data: dict[str, Any]
    # the definition and its workloads, when they came in the same request (`{solution, definition, workloads}`)
    bundle: DefinitionBundle | None = None
    # the submitter's token statistics (a `token_stats` object in JSON, a `token_stats` file part in multipart)
    token_stats: ts.AcceptedTokenStats | None = None


@dataclass(frozen=True)
class BodyLimits:
    """The solution's bound (what the whole body was held to before token statistics) and the statistics' own."""

    body: int = 1024 * 1024
    token_stats: int = 16 * 1024 * 1024


def _too_large(limit: int, field: str = BODY, what: str = "") -> ApiError:
    return ApiError(
        413, "request body too large", [FieldError(field=field, reason=f"{what}over the limit of {limit} bytes")]
    )


class InvalidSubmission(ApiError):
    """422 with each field at fault."""

    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__(422, "invalid solution", errors)


def _errors(err: FormatError) -> list[FieldError]:
    out = []
    for p in err.problems:
        field, _, reason = p.partition(": ")
        if field == "(root)" and _FIELD.fullmatch(reason.partition(": ")[0]) and ": " in reason:
            field, _, reason = reason.partition(": ")  # a model validator's "field: reason"
        out.append(FieldError(field=field, reason=reason) if reason else FieldError(field="(root)", reason=p))
    return out


def _unstorable(text: str) -> bool:
    """NUL, or a lone surrogate (JSON's "\\ud800" decodes to one): neither can be stored as UTF-8 text in Postgres."""
    if "\x00" in text:
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


def submission_from_json(body: bytes, limits: BodyLimits | None = None) -> ParsedSubmission:
    """A solution.json, or `{"solution": ..., "definition": ..., "workloads": [...]}` (all three documents at once);
    either may carry a top-level `token_stats` object, which is checked here and is not part of the solution."""
    limits = limits or BodyLimits()
    try:
        data = _loads(body)
    except InvalidSubmission:
        if len(body) > limits.body:  # only token_stats may take a body past the solution's limit
            raise _too_large(limits.body) from None
        raise
    raw_stats = data.pop(ts.JSON_FIELD) if isinstance(data, dict) and ts.JSON_FIELD in data else None
    encoded = raw_stats.get("data_base64") if isinstance(raw_stats, dict) else None
    if len(body) - (len(encoded) if isinstance(encoded, str) else 0) > limits.body:
        raise _too_large(limits.body, what="the request without token_stats.data_base64 is " if encoded else "")
    parsed = _submission_from_data(data)
    if raw_stats is None:
        return parsed
    return ParsedSubmission(
        solution=parsed.solution,
        data=parsed.data,
        bundle=parsed.bundle,
        token_stats=ts.from_json(raw_stats, limits.token_stats),
    )


def _loads(body: bytes) -> Any:
    try:
        return loads_bounded(body)
    except ValueError as err:  # bad UTF-8, bad JSON, too deep, or an integer of more than 4300 digits
        raise InvalidSubmission([FieldError(field="(body)", reason=f"not valid JSON: {err}")]) from err


def _submission_from_data(data: Any) -> ParsedSubmission:
    if not (isinstance(data, dict) and "solution" in data and isinstance(data.get("definition"), dict)):
        solution, sol_data = _solution_from_data(data)
        return ParsedSubmission(solution=solution, data=sol_data)
    bundle_doc = {k: v for k, v in data.items() if k != "solution"}
    try:
        bundle = parse_model(DefinitionBundle, bundle_doc, "definition bundle")
    except FormatError as err:
        raise InvalidSubmission(_errors(err)) from err
    solution, sol_data = _solution_from_data(data["solution"])
    if solution.definition != bundle.definition.name:
        raise InvalidSubmission(
            [
                FieldError(
                    field="solution.definition",
                    reason=(
                        f"names '{solution.definition[:200]}' but the definition sent with it is '{bundle.definition.name}'"
                    ),
                )
            ]
        )
    return ParsedSubmission(solution=solution, data=sol_data, bundle=bundle)


def solution_from_json(body: bytes) -> tuple[Solution, dict[str, Any]]:
    return _solution_from_data(_loads(body))


def _solution_from_data(data: Any) -> tuple[Solution, dict[str, Any]]:
    if any(_unstorable(s) for s in walk_strings(data)):
        raise InvalidSubmission(
            [
                FieldError(
                    field="(body)",
                    reason="NUL characters and lone surrogates (\\ud800-\\udfff) are not allowed in a solution",
                )
            ]
        )
    try:
        return parse_model(Solution, data, "solution.json"), data
    except FormatError as err:
        raise InvalidSubmission(_errors(err)) from err


def solution_from_upload(
    filename: str, content: bytes, definition: str, entry_function: str = "run", destination_passing_style: bool = True
) -> tuple[Solution, dict[str, Any]]:
    errors = []
    if not filename.endswith(".py") or "/" in filename or "\\" in filename or filename.startswith("."):
        errors.append(FieldError(field="file", reason="must be a single .py file"))
    try:
        text = content.decode()
    except UnicodeDecodeError:
        errors.append(FieldError(field="file", reason="must be UTF-8 text"))
        text = ""
    if "\x00" in text or "\x00" in definition or "\x00" in entry_function:
        errors.append(FieldError(field="file", reason="NUL characters are not allowed"))
    if not definition:
        errors.append(FieldError(field="definition", reason="a .py upload needs the definition name"))
    if errors:
        raise InvalidSubmission(errors)
    data = {
        "name": filename[:-3] or "solution",
        "definition": definition,
        "author": "",
        "description": f"single-file upload of {filename}",
        "spec": {
            "languages": ["triton" if ("import triton" in text or "from triton" in text) else "pytorch"],
            "entry_point": f"{filename}::{entry_function}",
            "destination_passing_style": destination_passing_style,
        },
        "sources": [{"path": filename, "content": text}],
    }
    try:
        return parse_model(Solution, data, filename), data
    except FormatError as err:
        raise InvalidSubmission(_errors(err)) from err


async def read_submission(request: Request) -> ParsedSubmission:
    """The request body as a Solution: a solution.json (JSON) or one .py file (multipart, with `definition`), and the
    submitter's token statistics when sent."""
    settings = request.app.state.services.settings
    limits = BodyLimits(body=settings.body_limit_bytes, token_stats=settings.token_stats_max_bytes)
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype == "application/json" or ctype.endswith("+json"):
        return submission_from_json(await request.body(), limits)
    elif ctype == "multipart/form-data":
        form = await request.form(max_files=2, max_fields=10)
        uploads = form.getlist("file")
        upload, definition = (uploads[0] if len(uploads) == 1 else None), form.get("definition")
        if not isinstance(upload, UploadFile):
            raise InvalidSubmission([FieldError(field="file", reason="one .py file upload is required")])
        content = await upload.read()
        if len(content) > limits.body:
            raise _too_large(limits.body, "file")
        dps = str(form.get("destination_passing_style", "true")).lower() not in ("false", "0", "no")
        solution, data = solution_from_upload(
            upload.filename or "",
            content,
            definition if isinstance(definition, str) else "",
            str(form.get("entry_function") or "run"),
            dps,
        )
        return ParsedSubmission(solution=solution, data=data, token_stats=await _stats_part(form, limits))
    else:
        raise ApiError(
            415,
            "send application/json (solution.json) or multipart/form-data (a .py file and definition)",
            [FieldError(field="content-type", reason=f"'{ctype[:100]}' is not accepted")],
        )


async def _stats_part(form: Any, limits: BodyLimits) -> ts.AcceptedTokenStats | None:
    part = form.get("token_stats")
    if part is None:
        return None
    if not isinstance(part, UploadFile):
        raise InvalidSubmission(
            [
                FieldError(
                    field="token_stats",
                    reason="must be a file part (.npy or .safetensors), for example curl -F token_stats=@ids.npy",
                )
            ]
        )
    data = await part.read()  # bounded by the route's body limit (app.main)
    key = form.get("token_stats_key")
    return ts.from_upload(
        part.filename or "",
        data,
        str(form.get("token_stats_kind") or "auto"),
        key if isinstance(key, str) else None,
        limits.token_stats,
    )


SubmissionBody = Annotated[ParsedSubmission, Depends(read_submission)]

__all__ = [
    "InvalidSubmission",
    "ParsedSubmission",
    "SolutionSpec",
    "SourceFile",
    "SubmissionBody",
    "solution_from_json",
    "solution_from_upload",
]
