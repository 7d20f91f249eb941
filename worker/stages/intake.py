"""Stage 1, intake: the solution parses, names this definition, its languages run here, its entry point exists,
sizes are in limits. How the file was read (kernel-audit's older spec.language, a rebound definition name) is shown
in the summary and under evidence.compat_notes."""

from __future__ import annotations

from worker.context import AuditContext
from worker.formats.entry_check import check_entry
from worker.formats.languages import CPP_LANGUAGES, PYTHON_LANGUAGES
from worker.formats.solution import MAX_SOURCE_BYTES
from worker.sandbox import SandboxError
from worker.stages.result import StageResult, StageStatus

NAME = "intake"


def _notes_suffix(notes: list[str]) -> str:
    return f" (read with {len(notes)} compat note(s): {'; '.join(notes)})" if notes else ""


def run(ctx: AuditContext) -> StageResult:
    sol, definition = ctx.solution, ctx.problem.definition
    notes = list(sol.compat_notes)
    evidence: dict[str, object] = {"languages": list(sol.spec.languages)}
    if notes:
        evidence["compat_notes"] = notes
    problems: list[str] = []
    if sol.definition != definition.name:
        problems.append(f"solution.definition is '{sol.definition}', expected '{definition.name}'")
    if sol.spec.is_cpp:
        return StageResult(
            name=NAME,
            status=StageStatus.error,
            summary=(f"languages {list(sol.spec.languages)} are compiled C++ ({', '.join(sorted(CPP_LANGUAGES))}), which "
                     "kernel-audit does not build yet: not supported yet; submit a Python-loaded solution "
                     f"({', '.join(sorted(PYTHON_LANGUAGES))})" + _notes_suffix(notes)),
            evidence=evidence,
        )
    if sol.spec.needs_gpu and not ctx.device.startswith("cuda"):
        return StageResult(
            name=NAME,
            status=StageStatus.error,
            summary=(f"languages {sol.spec.gpu_languages} run only on an NVIDIA GPU (CUDA), and this audit runs on "
                     f"{ctx.device}: audit it on a GPU worker" + _notes_suffix(notes)),
            evidence=evidence,
        )
    size = sum(len(s.content.encode()) for s in sol.sources)
    problems += [p.reason for p in check_entry(sol, list(definition.inputs), list(definition.outputs))]
    metrics = {"source_bytes": size, "files": len(sol.sources), "limit_bytes": MAX_SOURCE_BYTES}
    if problems:
        return StageResult(name=NAME, status=StageStatus.failed, summary="; ".join(problems) + _notes_suffix(notes),
                           metrics=metrics, evidence=evidence)
    ctx.progress("intake: importing the solution in its sandbox")
    try:
        ctx.sandbox()
    except SandboxError as err:
        return StageResult(
            name=NAME,
            status=StageStatus.failed,
            summary=f"the solution does not import: {err}" + _notes_suffix(notes),
            metrics=metrics,
            evidence={**evidence, "log": err.log[-2000:]},
        )
    return StageResult(
        name=NAME,
        status=StageStatus.passed,
        summary=(f"'{sol.name}' for {definition.name}: {len(sol.sources)} file(s), {size} bytes, entry point imports"
                 + _notes_suffix(notes)),
        metrics=metrics,
        evidence=evidence,
    )
