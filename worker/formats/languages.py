"""SOL-ExecBench's solution languages (`spec.languages`), the two ways each is loaded, and which need a GPU.

SOL-ExecBench (core/data/solution.py, SupportedLanguages) names nine languages in two families that a
solution may not mix:
  Python-loaded: pytorch, triton, cute_dsl, cutile, cudnn_frontend -- the entry file is a .py module imported
                 and its function called;
  compiled C++:  cuda_cpp, cutlass, cudnn, cublas -- every C/C++/CUDA source is built into one extension
                 (binding `torch`: torch.utils.cpp_extension) and the entry point names a function it exports.
The older form, one `spec.language` out of python, triton, cuda, cpp, is kernel-audit's first schema and also
SOL-ExecBench's own before `spec.languages` (its tests/samples at commit 3fa0f1f write a CuTe DSL kernel as
`"language": "python"` with the dependency `cutlass`, and a cuTile one with `cutile`); `legacy_languages` reads it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal, get_args

Language = Literal[
    "pytorch", "triton", "cute_dsl", "cutile", "cudnn_frontend", "cuda_cpp", "cutlass", "cudnn", "cublas"
]
LANGUAGES: Final[tuple[Language, ...]] = get_args(Language)

LanguageFamily = Literal["python", "cpp"]

# imported as a Python module by the sandbox, like a pytorch kernel
PYTHON_LANGUAGES: Final[frozenset[Language]] = frozenset({"pytorch", "triton", "cute_dsl", "cutile", "cudnn_frontend"})
# built from C/C++/CUDA sources into one extension module before anything runs
CPP_LANGUAGES: Final[frozenset[Language]] = frozenset({"cuda_cpp", "cutlass", "cudnn", "cublas"})
# PyTorch runs anywhere and Triton has its CPU interpreter (TRITON_INTERPRET=1); every other language
# (CuTe DSL, cuTile, the cuDNN frontend, and everything compiled with nvcc) needs a CUDA device
CPU_CAPABLE_LANGUAGES: Final[frozenset[Language]] = frozenset({"pytorch", "triton"})
GPU_ONLY_LANGUAGES: Final[frozenset[Language]] = frozenset(LANGUAGES) - CPU_CAPABLE_LANGUAGES

# the entry file's suffix SOL-ExecBench requires of each family (BuildSpec._validate_languages)
PYTHON_SUFFIXES: Final[tuple[str, ...]] = (".py",)
CPP_SUFFIXES: Final[tuple[str, ...]] = (".cu", ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".cuh")

# kernel-audit's older `spec.language` -> SOL-ExecBench's `spec.languages`. `cpp` was plain C++ built as a torch
# extension; SOL-ExecBench has no CPU-only C++ language, and cuda_cpp is the one that builds any C++ source
LEGACY_LANGUAGES: Final[dict[str, tuple[Language, ...]]] = {
    "python": ("pytorch",),
    "triton": ("triton",),
    "cuda": ("cuda_cpp",),
    "cpp": ("cuda_cpp",),
}


# in the older form a Python solution named its GPU DSL only among its dependencies; the first match decides. Without
# this a CuTe DSL or cuTile kernel would be read as PyTorch, accepted on a CPU-only deployment and fail at import
LEGACY_PYTHON_DEPENDENCIES: Final[tuple[tuple[frozenset[str], Language], ...]] = (
    (frozenset({"cutile", "cuda-tile", "cuda_tile", "cuda.tile"}), "cutile"),
    (frozenset({"cutlass", "cute", "cute_dsl", "cute-dsl", "cutlass-dsl", "nvidia-cutlass-dsl"}), "cute_dsl"),
    (frozenset({"cudnn_frontend", "cudnn-frontend", "nvidia-cudnn-frontend"}), "cudnn_frontend"),
    (frozenset({"triton"}), "triton"),
)


def legacy_languages(old: str, dependencies: object) -> tuple[Language, ...]:
    """SOL-ExecBench's `spec.languages` for an older-form `spec.language` (a key of LEGACY_LANGUAGES), reading a
    Python solution's dependencies for the GPU DSL it uses."""
    if old == "python" and isinstance(dependencies, list):
        names = {d.strip().lower() for d in dependencies if isinstance(d, str)}
        for aliases, language in LEGACY_PYTHON_DEPENDENCIES:
            if names & aliases:
                return (language,)
    return LEGACY_LANGUAGES[old]


def family_of(languages: Iterable[Language]) -> LanguageFamily:
    """python or cpp; a list that mixes them is refused where it is parsed (SolutionSpec)."""
    return "cpp" if any(lang in CPP_LANGUAGES for lang in languages) else "python"


def gpu_only(languages: Iterable[Language]) -> list[Language]:
    """The languages in the list that run only on a CUDA device, in the list's order."""
    return [lang for lang in languages if lang in GPU_ONLY_LANGUAGES]


def legacy_note(old: str, new: tuple[Language, ...]) -> str:
    """The compat note a report shows for a solution written in the older form."""
    return (
        f"spec.language '{old}' is the older single-language form (kernel-audit's first schema, and SOL-ExecBench's "
        f"before spec.languages); read as spec.languages {list(new)} "
        "(SOL-ExecBench's form: a list of pytorch, triton, cute_dsl, cutile, cudnn_frontend, cuda_cpp, cutlass, cudnn, cublas)"
    )
