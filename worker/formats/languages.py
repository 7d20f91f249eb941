"""SOL-ExecBench's solution languages (`spec.languages`), the two ways each is loaded, and which need a GPU.

SOL-ExecBench (core/data/solution.py, SupportedLanguages) names nine languages in two families that a
solution may not mix:
  Python-loaded: pytorch, triton, cute_dsl, cutile, cudnn_frontend -- the entry file is a .py module imported
                 and its function called;
  compiled C++:  cuda_cpp, cutlass, cudnn, cublas -- every C/C++/CUDA source is built into one extension
                 (binding `torch`: torch.utils.cpp_extension) and the entry point names a function it exports.
kernel-audit's older form had one `spec.language` out of python, triton, cuda, cpp; LEGACY_LANGUAGES reads it.
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


def family_of(languages: Iterable[Language]) -> LanguageFamily:
    """python or cpp; a list that mixes them is refused where it is parsed (SolutionSpec)."""
    return "cpp" if any(lang in CPP_LANGUAGES for lang in languages) else "python"


def gpu_only(languages: Iterable[Language]) -> list[Language]:
    """The languages in the list that run only on a CUDA device, in the list's order."""
    return [lang for lang in languages if lang in GPU_ONLY_LANGUAGES]


def legacy_note(old: str, new: tuple[Language, ...]) -> str:
    """The compat note a report shows for a solution written in the older form."""
    return (
        f"spec.language '{old}' is kernel-audit's older form; read as spec.languages {list(new)} "
        "(SOL-ExecBench's form: a list of pytorch, triton, cute_dsl, cutile, cudnn_frontend, cuda_cpp, cutlass, cudnn, cublas)"
    )
