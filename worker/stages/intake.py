"""Stage 1, intake: the solution parses, names this definition, its languages run here, its entry point exists,
sizes are in limits. How the file was read (kernel-audit's older spec.language, a rebound definition name) is shown
in the summary and under evidence.compat_notes."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterable
from typing import Final, NamedTuple

from worker.context import AuditContext
from worker.formats.entry_check import check_entry
from worker.formats.languages import Language
from worker.formats.solution import MAX_SOURCE_BYTES
from worker.language_requirements import device_facts, unmet_requirements
from worker.report import WORKER_LIMIT
from worker.sandbox import SandboxError, SandboxOutOfMemory
from worker.stages.result import StageResult, StageStatus

NAME = "intake"

GPU_EXTRA: Final = "pip install 'kernel-audit[gpu]'"


class DslPackage(NamedTuple):
    module: str  # what a solution in that language imports
    distribution: str  # what provides it: one of pyproject's `gpu` extra
    what: str  # its name in messages


# The Python-loaded GPU languages are plain modules that import their DSL; the sandbox imports them like a pytorch
# kernel, so the one thing a worker must add is the DSL package itself (pins: pyproject's `gpu` extra)
DSL_PACKAGES: Final[dict[Language, DslPackage]] = {
    "cute_dsl": DslPackage("cutlass", "nvidia-cutlass-dsl", "the CuTe DSL"),
    "cutile": DslPackage("cuda.tile", "cuda-tile", "cuTile"),
    "cudnn_frontend": DslPackage("cudnn", "nvidia-cudnn-frontend", "the cuDNN frontend"),
}

_NO_MODULE = re.compile(r"No module named '([^']+)'")


def _installed(module: str) -> bool:
    """Whether `module` can be imported here, without importing it (a DSL's import is slow and starts CUDA work);
    for a dotted name only its parents are imported (for cuTile, `cuda`: a light package)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def install_hint(package: DslPackage) -> str:
    return f"install {package.distribution}, pinned by kernel-audit's `gpu` extra ({GPU_EXTRA})"


def missing_dsl_packages(languages: Iterable[Language]) -> list[str]:
    """For each language whose DSL package this worker lacks: what is missing and what to install."""
    return [
        f"{lang} needs {pkg.what} (Python module '{pkg.module}'), which this worker does not have: {install_hint(pkg)}"
        for lang in languages
        if (pkg := DSL_PACKAGES.get(lang)) is not None and not _installed(pkg.module)
    ]


def load_error_hint(message: str) -> str:
    """A load error that names a DSL module this worker lacks ("No module named 'cutlass'") says what to install."""
    m = _NO_MODULE.search(message)
    if m is None:
        return ""
    missing = m.group(1)
    for pkg in DSL_PACKAGES.values():
        # `cuda.tile` is missing as 'cuda' when no cuda namespace package is installed at all
        if missing == pkg.module or missing.startswith(pkg.module + ".") or pkg.module.startswith(missing + "."):
            return f"; {pkg.what} is Python module '{pkg.module}': {install_hint(pkg)}"
    return ""


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
    if sol.spec.needs_gpu and not ctx.device.startswith("cuda"):
        return StageResult(
            name=NAME,
            status=StageStatus.error,
            summary=(
                f"languages {sol.spec.gpu_languages} run only on an NVIDIA GPU (CUDA), and this audit runs on "
                f"{ctx.device}: audit it on a GPU worker" + _notes_suffix(notes)
            ),
            evidence=evidence,
        )
    missing = missing_dsl_packages(sol.spec.languages)
    if missing:  # the worker's setup, not the solution, is at fault: inconclusive, like any worker error
        return StageResult(
            name=NAME, status=StageStatus.error, summary="; ".join(missing) + _notes_suffix(notes), evidence=evidence
        )
    if ctx.device.startswith("cuda"):
        unmet = unmet_requirements(sol.spec.languages, device_facts(ctx.device))
        if unmet:  # e.g. cuTile on a Hopper: the worker cannot run it, which says nothing about the kernel
            evidence[WORKER_LIMIT] = "; ".join(unmet)
            return StageResult(
                name=NAME, status=StageStatus.error, summary="; ".join(unmet) + _notes_suffix(notes), evidence=evidence
            )
    size = sum(len(s.content.encode()) for s in sol.sources)
    problems += [p.reason for p in check_entry(sol, list(definition.inputs), list(definition.outputs))]
    metrics = {"source_bytes": size, "files": len(sol.sources), "limit_bytes": MAX_SOURCE_BYTES}
    if problems:
        return StageResult(
            name=NAME,
            status=StageStatus.failed,
            summary="; ".join(problems) + _notes_suffix(notes),
            metrics=metrics,
            evidence=evidence,
        )
    compiled = ""
    if sol.spec.is_cpp:
        step = _compile(ctx, metrics, evidence)
        if isinstance(step, StageResult):
            return step
        compiled = step
    ctx.progress("intake: importing the solution in its sandbox")
    try:
        ctx.sandbox()
    except SandboxOutOfMemory:  # the device's load, not the solution: the engine waits for memory and runs intake again
        raise
    except SandboxError as err:
        return StageResult(
            name=NAME,
            status=StageStatus.failed,
            summary=f"the solution does not import: {err}{load_error_hint(str(err))}" + _notes_suffix(notes),
            metrics=metrics,
            evidence={**evidence, "log": err.log[-2000:]},
        )
    return StageResult(
        name=NAME,
        status=StageStatus.passed,
        summary=(
            f"'{sol.name}' for {definition.name}: {len(sol.sources)} file(s), {size} bytes, {compiled}entry point "
            "imports" + _notes_suffix(notes)
        ),
        metrics=metrics,
        evidence=evidence,
    )


def _compile(ctx: AuditContext, metrics: dict[str, object], evidence: dict[str, object]) -> StageResult | str:
    """The `compile` step of a C++ solution (worker.compile_step): its time and outcome in the report; a compile
    error fails intake with the compiler's first errors, a worker without the toolchain is inconclusive."""
    from worker.compile_step import compile_solution, loadable

    ctx.progress("intake: compiling in the sandbox")
    result = compile_solution(ctx.solution, ctx.device)
    evidence["compile"] = {
        "status": result.status,
        "seconds": result.seconds,
        "compile_seconds": result.compile_seconds,
        "cached": result.cached,
        "message": result.message,
        "first_errors": result.first_errors,
        "isolation": result.isolation,
        "log_tail": result.compiler_log_tail[-2000:],
        **({"cache_note": result.cache_note} if result.cache_note else {}),
    }
    metrics["compile_s"] = result.seconds
    if result.status == "toolchain_missing":
        return StageResult(
            name=NAME,
            status=StageStatus.error,
            metrics=metrics,
            evidence=evidence,
            summary=f"this worker cannot build C++ solutions: {result.message}",
        )
    if not result.ok:
        errors = "; ".join(result.first_errors[:3])
        return StageResult(
            name=NAME,
            status=StageStatus.failed,
            metrics=metrics,
            evidence=evidence,
            summary=f"COMPILE_ERROR: {result.message}" + (f": {errors}" if errors else ""),
        )
    ctx.artifact = loadable(result)
    return f"compiled in {result.seconds:.1f} s{' (cached)' if result.cached else ''}, "
