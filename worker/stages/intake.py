"""Stage 1, intake: the solution parses, names this definition, its entry point exists, sizes are in limits."""

from __future__ import annotations

import ast

from worker.context import AuditContext
from worker.formats.solution import MAX_SOURCE_BYTES
from worker.sandbox import SandboxError
from worker.stages.result import StageResult, StageStatus

NAME = "intake"


def run(ctx: AuditContext) -> StageResult:
    sol, definition = ctx.solution, ctx.problem.definition
    problems: list[str] = []
    if sol.definition != definition.name:
        problems.append(f"solution.definition is '{sol.definition}', expected '{definition.name}'")
    if sol.spec.language in ("cuda", "cpp"):
        return StageResult(
            name=NAME,
            status=StageStatus.error,
            summary=f"language '{sol.spec.language}' is not supported yet: submit a python or triton solution",
        )
    size = sum(len(s.content.encode()) for s in sol.sources)
    entry_src = sol.source(sol.spec.entry_file)
    try:
        tree = ast.parse(entry_src)
    except SyntaxError as e:
        problems.append(f"{sol.spec.entry_file} line {e.lineno}: syntax error: {e.msg}")
        tree = None
    if tree is not None:
        funcs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        assigned = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        fn = sol.spec.entry_function
        if fn not in funcs and fn not in assigned:
            problems.append(f"entry point '{fn}' is not defined at the top level of {sol.spec.entry_file}")
        elif fn in funcs:
            n_in, n_out = len(definition.inputs), len(definition.outputs)
            expected = n_in + n_out if sol.spec.destination_passing_style else n_in
            a = funcs[fn].args
            positional = len(a.posonlyargs) + len(a.args)
            if a.vararg is None and positional < expected:
                style = "inputs then outputs (destination passing style)" if sol.spec.destination_passing_style else "inputs"
                problems.append(
                    f"entry point '{fn}' takes {positional} positional arguments; the definition needs {expected}: "
                    f"{style} in order {list(definition.inputs) + (list(definition.outputs) if sol.spec.destination_passing_style else [])}"
                )
    metrics = {"source_bytes": size, "files": len(sol.sources), "limit_bytes": MAX_SOURCE_BYTES}
    if problems:
        return StageResult(name=NAME, status=StageStatus.failed, summary="; ".join(problems), metrics=metrics)
    ctx.progress("intake: importing the solution in its sandbox")
    try:
        ctx.sandbox()
    except SandboxError as err:
        return StageResult(
            name=NAME,
            status=StageStatus.failed,
            summary=f"the solution does not import: {err}",
            metrics=metrics,
            evidence={"log": err.log[-2000:]},
        )
    return StageResult(
        name=NAME,
        status=StageStatus.passed,
        summary=f"'{sol.name}' for {definition.name}: {len(sol.sources)} file(s), {size} bytes, entry point imports",
        metrics=metrics,
    )
