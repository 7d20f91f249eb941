"""What a build reports: the `compile` step of an audit, with its time, and on COMPILE_ERROR the compiler's first
errors (or the refusals that stopped it before the compiler ran)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

BuildStatus = Literal["built", "compile_error", "toolchain_missing"]
BudgetKind = Literal["wall_time", "cpu_time", "memory", "output_size", "processes"]

MODULE_NAME = "benchmark_kernel"  # SOL-ExecBench's: TORCH_EXTENSION_NAME, so PyInit_benchmark_kernel
BUDGET_EXCEEDED = "compile budget exceeded"


class BuildResult(BaseModel):
    """One build. `status`: built (artifact ready), compile_error (the submission's fault: refused flags or
    includes, the compiler's errors, or the compile budget), toolchain_missing (this worker's fault: inconclusive)."""

    model_config = ConfigDict(frozen=True)

    status: BuildStatus
    artifact: Path | None = Field(None, description="the extension (.so), in the build cache")
    artifact_sha256: str | None = None
    key: str | None = Field(None, description="the cache key the artifact is stored and loaded under")
    module_name: str = MODULE_NAME
    entry_symbol: str
    seconds: float = Field(description="wall time of this step: checks, cache look-up and (unless cached) compile")
    compile_seconds: float | None = Field(None, description="the compiler's own run; None when cached or refused")
    cached: bool = False
    message: str = Field("", description="one line for the report")
    first_errors: list[str] = Field(default_factory=list)
    compiler_log_tail: str = ""
    budget_exceeded: BudgetKind | None = None
    cache_note: str | None = Field(None, description="a cache entry that was refused and rebuilt, and why")
    isolation: str = Field("namespaces", description="how the compiler was isolated")

    @property
    def ok(self) -> bool:
        return self.status == "built"


# gcc/g++ "file:line:col: error: ...", "fatal error:", nvcc "file(line): error: ...", the linker's complaints
_ERROR_LINE = re.compile(
    r"(^|[\s:])(fatal )?error( [A-Z]+[0-9]+)?:|\): error|undefined reference to|cannot find -l|"
    r"ld(\.[a-z]+)?: .*(error|cannot)|collect2: error|signal terminated program|internal compiler error|"
    r"Killed|CPU time limit exceeded|File size limit exceeded|No space left on device|out of memory|"
    r"virtual memory exhausted|Cannot allocate memory"
)


def first_errors(log: str, n: int = 8, strip: tuple[str, ...] = ()) -> list[str]:
    """The first `n` distinct error lines of a compiler log, with the build's own folders cut from paths."""
    found: list[str] = []
    for line in log.splitlines():
        if not _ERROR_LINE.search(line) or line.startswith(("FAILED:", "ninja:")):
            continue
        for prefix in strip:
            line = line.replace(prefix.rstrip("/") + "/", "")
        line = line.strip()[:500]
        if line and line not in found:
            found.append(line)
        if len(found) >= n:
            break
    return found


def budget_from_log(log: str) -> BudgetKind | None:
    """Which per-process limit a compiler hit, read off what the compiler driver or the shell said."""
    if "CPU time limit exceeded" in log:
        return "cpu_time"
    if "File size limit exceeded" in log or "No space left on device" in log:
        return "output_size"
    if re.search(
        r"out of memory|virtual memory exhausted|Cannot allocate memory|std::bad_alloc|"
        r"Killed signal terminated program",
        log,
    ):
        return "memory"
    if "Resource temporarily unavailable" in log and "fork" in log:
        return "processes"
    return None
