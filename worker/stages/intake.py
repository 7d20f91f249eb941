"""Stage 1, intake: the solution parses, names this definition, its entry point exists, sizes are in limits."""

from __future__ import annotations

from worker.context import AuditContext
from worker.formats.entry_check import check_entry
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
    problems += [p.reason for p in check_entry(sol, list(definition.inputs), list(definition.outputs))]
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
