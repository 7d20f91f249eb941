"""Turn a request body (solution.json, or a multipart .py upload) into a Solution, or field/reason errors."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request
from starlette.datastructures import UploadFile

from app.core.errors import ApiError, FieldError
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


def submission_from_json(body: bytes) -> ParsedSubmission:
    """A solution.json, or `{"solution": ..., "definition": ..., "workloads": [...]}` (all three documents at once)."""
    try:
        data = loads_bounded(body)
    except ValueError as err:
        raise InvalidSubmission([FieldError(field="(body)", reason=f"not valid JSON: {err}")]) from err
    if not (isinstance(data, dict) and "solution" in data and isinstance(data.get("definition"), dict)):
        solution, sol_data = solution_from_json(body)
        return ParsedSubmission(solution=solution, data=sol_data)
    bundle_doc = {k: v for k, v in data.items() if k != "solution"}
    try:
        bundle = parse_model(DefinitionBundle, bundle_doc, "definition bundle")
    except FormatError as err:
        raise InvalidSubmission(_errors(err)) from err
    solution, sol_data = solution_from_json(json.dumps(data["solution"]).encode())
    if solution.definition != bundle.definition.name:
        raise InvalidSubmission([FieldError(field="solution.definition", reason=(
            f"names '{solution.definition[:200]}' but the definition sent with it is '{bundle.definition.name}'"))])
    return ParsedSubmission(solution=solution, data=sol_data, bundle=bundle)


def solution_from_json(body: bytes) -> tuple[Solution, dict[str, Any]]:
    try:
        data = loads_bounded(body)
    except ValueError as err:  # bad UTF-8, bad JSON, too deep, or an integer of more than 4300 digits
        raise InvalidSubmission([FieldError(field="(body)", reason=f"not valid JSON: {err}")]) from err
    if any(_unstorable(s) for s in walk_strings(data)):
        raise InvalidSubmission([FieldError(field="(body)", reason="NUL characters and lone surrogates (\\ud800-\\udfff) are "
                                                                    "not allowed in a solution")])
    try:
        return parse_model(Solution, data, "solution.json"), data
    except FormatError as err:
        raise InvalidSubmission(_errors(err)) from err


def solution_from_upload(filename: str, content: bytes, definition: str, entry_function: str = "run",
                         destination_passing_style: bool = True) -> tuple[Solution, dict[str, Any]]:
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
        "spec": {"language": "triton" if ("import triton" in text or "from triton" in text) else "python",
                 "entry_point": f"{filename}::{entry_function}", "destination_passing_style": destination_passing_style},
        "sources": [{"path": filename, "content": text}],
    }
    try:
        return parse_model(Solution, data, filename), data
    except FormatError as err:
        raise InvalidSubmission(_errors(err)) from err


async def read_submission(request: Request) -> ParsedSubmission:
    """The request body as a Solution: a solution.json (JSON) or one .py file (multipart, with `definition`)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype == "application/json" or ctype.endswith("+json"):
        return submission_from_json(await request.body())
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
        raise ApiError(415, "send application/json (solution.json) or multipart/form-data (a .py file and definition)",
                       [FieldError(field="content-type", reason=f"'{ctype[:100]}' is not accepted")])
    return ParsedSubmission(solution=solution, data=data)


SubmissionBody = Annotated[ParsedSubmission, Depends(read_submission)]

__all__ = ["InvalidSubmission", "ParsedSubmission", "SolutionSpec", "SourceFile", "SubmissionBody", "solution_from_json",
           "solution_from_upload"]
