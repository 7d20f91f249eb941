"""The cheap checks of a Python-loaded solution against its definition, from its source text alone (no import, no
torch): the entry file parses, the entry point is defined at its top level, and takes as many positional arguments as
the definition passes. Intake runs them before importing the solution; the API answers them at POST time."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass

from worker.formats.solution import Solution


@dataclass(frozen=True)
class EntryProblem:
    field: str
    reason: str


def check_entry(solution: Solution, inputs: Sequence[str], outputs: Sequence[str]) -> list[EntryProblem]:
    """What is wrong with the solution's entry point for a definition with these inputs and outputs (in order)."""
    spec = solution.spec
    if not spec.is_python:  # a C++ entry point names what the built extension exports: only the build can tell
        return []
    index = next(i for i, s in enumerate(solution.sources) if s.path == spec.entry_file)
    try:
        tree = ast.parse(solution.sources[index].content)
    except SyntaxError as e:
        return [EntryProblem(f"sources.{index}.content", f"{spec.entry_file} line {e.lineno}: syntax error: {e.msg}")]
    except (ValueError, RecursionError, MemoryError) as e:  # NUL bytes, or nesting too deep for the parser
        return [EntryProblem(f"sources.{index}.content", f"{spec.entry_file} cannot be parsed: {type(e).__name__}")]
    funcs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assigned = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    fn = spec.entry_function
    if fn not in funcs and fn not in assigned:
        return [
            EntryProblem("spec.entry_point", f"entry point '{fn}' is not defined at the top level of {spec.entry_file}")
        ]
    if fn not in funcs:
        return []
    expected = len(inputs) + len(outputs) if spec.destination_passing_style else len(inputs)
    a = funcs[fn].args
    positional = len(a.posonlyargs) + len(a.args)
    if a.vararg is None and positional < expected:
        style = "inputs then outputs (destination passing style)" if spec.destination_passing_style else "inputs"
        names = list(inputs) + (list(outputs) if spec.destination_passing_style else [])
        return [
            EntryProblem(
                "spec.entry_point",
                f"entry point '{fn}' takes {positional} positional arguments; the definition "
                f"needs {expected}: {style} in order {names}",
            )
        ]
    return []
