"""The `compile` step of a C++-language solution (cuda_cpp, cutlass, cudnn, cublas): the solution's spec mapped onto a
build (worker.build: compiler and linker in the sandbox, a cache keyed by sources, flags, toolchain and GPU), and
what the sandboxed child needs to load the result.

A build that is the submission's fault (refused flags or #includes, the compiler's errors, the compile budget) is a
COMPILE_ERROR with the compiler's first errors; a worker without the toolchain is inconclusive and names what to
install. The artifact travels to the child as bytes with its sha256, and the child loads exactly those bytes."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel

from worker.build import BuildCache, BuildRequest, BuildResult, BuildSource, build
from worker.formats import Solution

CACHE_ENV = "KAUDIT_BUILD_CACHE"


class LoadableArtifact(BaseModel):
    """What the child's `load` needs for a compiled solution."""

    sha256: str
    entry_symbol: str
    data: bytes


def build_cache() -> BuildCache:
    """The worker's build cache: $KAUDIT_BUILD_CACHE, else under the engine's cache folder."""
    root = os.environ.get(CACHE_ENV) or str(
        Path(os.environ.get("KAUDIT_CACHE_DIR", Path.home() / ".cache" / "kaudit")) / "builds"
    )
    return BuildCache(Path(root))


def gpu_arch(device: str) -> str | None:
    """The sm_XY (with the arch-specific `a` suffix on Hopper and Blackwell) of the audit's GPU."""
    if not device.startswith("cuda"):
        return None
    import torch

    major, minor = torch.cuda.get_device_capability(torch.device(device))
    return f"sm_{major}{minor}{'a' if major >= 9 else ''}"


def request_of(solution: Solution, device: str) -> BuildRequest:
    spec = solution.spec
    options = spec.effective_compile_options
    return BuildRequest(
        sources=tuple(BuildSource(path=s.path, content=s.content) for s in solution.sources),
        languages=tuple(lang for lang in spec.languages if lang in ("cuda_cpp", "cutlass", "cudnn", "cublas")),  # type: ignore[misc]
        entry_symbol=spec.entry_function,
        binding="torch",
        cflags=tuple(options.cflags),
        cuda_cflags=tuple(options.cuda_cflags),
        ld_flags=tuple(options.ld_flags),
        dependencies=tuple(spec.dependencies),
        target_arch=gpu_arch(device),
    )


def compile_solution(solution: Solution, device: str) -> BuildResult:
    return build(request_of(solution, device), cache=build_cache())


def loadable(result: BuildResult) -> LoadableArtifact:
    assert result.ok and result.artifact is not None and result.artifact_sha256 is not None
    return LoadableArtifact(
        sha256=result.artifact_sha256, entry_symbol=result.entry_symbol, data=Path(result.artifact).read_bytes()
    )
