"""Read the formats from disk, turning every failure into a FormatError."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from worker.formats.definition import Definition
from worker.formats.exceptions import FormatError, describe_validation_error
from worker.formats.json_bounds import loads_bounded
from worker.formats.solution import Solution, SolutionSpec, SourceFile
from worker.formats.workload import Workload

M = TypeVar("M", bound=BaseModel)


def parse_model(model: type[M], data: object, source: str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise FormatError(source, describe_validation_error(err)) from err


def _read_json(path: Path) -> object:
    try:
        return loads_bounded(path.read_text())
    except FileNotFoundError as err:
        raise FormatError(str(path), ["file not found"]) from err
    except ValueError as err:  # bad UTF-8, bad JSON, too deep, or an integer of more than 4300 digits
        raise FormatError(str(path), [f"not valid JSON: {err}"]) from err
    except OSError as err:
        raise FormatError(str(path), [f"cannot read: {err.strerror or err}"]) from err


def load_definition(path: Path) -> Definition:
    return parse_model(Definition, _read_json(path), str(path))


def load_solution(path: Path) -> Solution:
    return parse_model(Solution, _read_json(path), str(path))


class WorkloadTrace(BaseModel):
    """A workload.jsonl line in SOL-ExecBench's dataset form: a trace that carries only its workload
    (`{"definition": ..., "workload": {...}, "solution": null, "evaluation": null}`)."""

    model_config = ConfigDict(extra="allow")
    definition: str = Field(min_length=1)
    workload: dict[str, object]


def _is_wrapped(data: object) -> bool:
    # a bare workload always has `inputs` at the top; a trace has them one level down, under `workload`
    return isinstance(data, dict) and isinstance(data.get("workload"), dict) and "inputs" not in data


def load_workloads(path: Path, definition: str | None = None) -> list[Workload]:
    """Every workload in a workload.jsonl, each line bare or wrapped as a workload trace (both occur in
    SOL-ExecBench's dataset). A wrapped line must name `definition` when the caller gives one; without it, every
    wrapped line must name the same definition (a file that mixes two is not one definition's workloads)."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError as err:
        raise FormatError(str(path), ["file not found"]) from err
    out = []
    named: tuple[str, int] | None = (definition, 0) if definition is not None else None
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as err:
            raise FormatError(f"{path}:{i}", [f"not valid JSON: {err}"]) from err
        if _is_wrapped(data):
            trace = parse_model(WorkloadTrace, data, f"{path}:{i}")
            if named is None:
                named = (trace.definition, i)
            elif trace.definition != named[0]:
                whose = "the definition being loaded" if named[1] == 0 else f"line {named[1]}'s"
                raise FormatError(
                    f"{path}:{i}", [f"definition: a workload of '{trace.definition}', not of '{named[0]}' ({whose})"]
                )
            data = trace.workload
        out.append(parse_model(Workload, data, f"{path}:{i}"))
    return out


def solution_from_python_file(
    path: Path, definition: str, *, destination_passing_style: bool = True, entry_function: str = "run"
) -> Solution:
    """The shorthand: a single .py file with a `run` function is a pytorch solution (triton if it imports triton)."""
    try:
        content = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise FormatError(str(path), [f"cannot read: {err}"]) from err
    uses_triton = "import triton" in content or "from triton" in content
    return parse_model(
        Solution,
        Solution(
            name=path.stem,
            definition=definition,
            author="",
            description=f"single-file shorthand for {path.name}",
            spec=SolutionSpec(
                languages=["triton" if uses_triton else "pytorch"],
                entry_point=f"{path.name}::{entry_function}",
                destination_passing_style=destination_passing_style,
            ),
            sources=[SourceFile(path=path.name, content=content)],
        ).model_dump(),
        str(path),
    )
