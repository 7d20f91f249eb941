"""Builds the C++ languages of SOL-ExecBench (cuda_cpp, cutlass, cudnn, cublas) into a torch extension, the way
SOL-ExecBench does (torch.utils.cpp_extension's flags, ninja, g++/nvcc), with the compiler and linker in the
sandbox: sources and flags are hostile.

    from worker.build import BuildCache, BuildRequest, build
    result = build(BuildRequest(...), cache=BuildCache(root))
    # in the sandboxed child only:
    fn = load_extension(result.artifact, result.artifact_sha256, result.entry_symbol)

Modules: request (the input model), flags (allow-list of compile options), includes (what sources may read),
toolchain (nvcc, CUTLASS, cuDNN frontend), plan (the ninja file), sandboxed (the isolated run and its budget),
cache, result, builder (the whole step), loader (the child's side).
"""

from worker.build.builder import build
from worker.build.cache import BuildCache, CacheRefused
from worker.build.flags import FlagsRefused, PathPolicy, Refusal, check_flags
from worker.build.includes import check_includes
from worker.build.loader import ArtifactMismatch, EntrySymbolMissing, ModuleAlreadyLoaded, load_extension
from worker.build.request import CPP_LANGUAGES, BuildRequest, BuildSource
from worker.build.result import MODULE_NAME, BuildResult
from worker.build.sandboxed import CompileBudget
from worker.build.toolchain import Toolchain, discover

__all__ = [
    "CPP_LANGUAGES",
    "MODULE_NAME",
    "ArtifactMismatch",
    "BuildCache",
    "BuildRequest",
    "BuildResult",
    "BuildSource",
    "CacheRefused",
    "CompileBudget",
    "EntrySymbolMissing",
    "FlagsRefused",
    "ModuleAlreadyLoaded",
    "PathPolicy",
    "Refusal",
    "Toolchain",
    "build",
    "check_flags",
    "check_includes",
    "discover",
    "load_extension",
]
