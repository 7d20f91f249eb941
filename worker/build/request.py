"""What a build is asked for: the C++ side of a SOL-ExecBench solution, in a model of our own.

The solution model (worker.formats) is being reworked; this package reads only `BuildRequest`, so the stage that
wires it in maps `spec.languages`, `spec.compile_options`, `spec.dependencies`, `spec.binding` and the entry
point's symbol onto it (see `BuildRequest` field docs).
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

CppLanguage = Literal["cuda_cpp", "cutlass", "cudnn", "cublas"]
CPP_LANGUAGES: frozenset[str] = frozenset(("cuda_cpp", "cutlass", "cudnn", "cublas"))

# what SOL-ExecBench hands to torch.utils.cpp_extension: top-level files with these suffixes are compiled; every
# source (headers too) is written to the build folder so they can be #included
COMPILED_SUFFIXES = (".cu", ".cpp", ".cc", ".cxx", ".c")
CUDA_SUFFIXES = (".cu",)

MAX_SOURCES = 64
MAX_SOURCE_BYTES = 4 * 1024 * 1024
MAX_TOTAL_BYTES = 16 * 1024 * 1024  # the parent scans every byte before compiling
MAX_FLAGS = 128
_PLAIN_PATH = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*(/[A-Za-z0-9_][A-Za-z0-9_.+-]*)*")


class BuildSource(BaseModel):
    """One file of the solution, at a relative path inside the build folder."""

    model_config = ConfigDict(frozen=True)

    path: str = Field(min_length=1, max_length=255)
    content: str = Field(max_length=MAX_SOURCE_BYTES)

    @field_validator("path")
    @classmethod
    def _relative_inside(cls, v: str) -> str:
        # the build folder is the only place sources go: relative, no way up, no hidden or odd names (the path
        # is written into a ninja file and a shell command, so only characters that need no escaping there)
        if not _PLAIN_PATH.fullmatch(v):
            raise ValueError(f"source path must be relative, inside the solution, of letters, digits and ._+-: {v!r}")
        return str(PurePosixPath(v))


class BuildRequest(BaseModel):
    """A C++-language solution to compile into a torch extension (SOL-ExecBench's `binding: torch`)."""

    model_config = ConfigDict(frozen=True)

    sources: tuple[BuildSource, ...] = Field(min_length=1, max_length=MAX_SOURCES)
    languages: tuple[CppLanguage, ...] = Field(min_length=1, description="spec.languages (C++ ones only)")
    entry_symbol: str = Field(
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="the part of spec.entry_point after '::'"
    )
    binding: Literal["torch"] = Field("torch", description="spec.binding; None in the solution means torch")
    cflags: tuple[str, ...] = Field((), max_length=MAX_FLAGS, description="compile_options.cflags (g++)")
    cuda_cflags: tuple[str, ...] = Field((), max_length=MAX_FLAGS, description="compile_options.cuda_cflags (nvcc)")
    ld_flags: tuple[str, ...] = Field((), max_length=MAX_FLAGS, description="compile_options.ld_flags")
    dependencies: tuple[str, ...] = Field((), max_length=32, description="spec.dependencies")
    target_arch: str | None = Field(
        None,
        pattern=r"^sm_[0-9]{2,3}[af]?$",
        description="the GPU to build device code for (e.g. sm_90a); needed when a .cu file is compiled and "
        "cuda_cflags name no -gencode/-arch",
    )

    @model_validator(mode="after")
    def _unique_paths(self) -> "BuildRequest":
        paths = [s.path for s in self.sources]
        if len(set(paths)) != len(paths):
            raise ValueError("duplicate source paths")
        if sum(len(s.content) for s in self.sources) > MAX_TOTAL_BYTES:
            raise ValueError(f"the sources hold more than {MAX_TOTAL_BYTES // 2**20} MiB together")
        if not self.compiled_sources:
            raise ValueError(f"no top-level source to compile (suffixes {', '.join(COMPILED_SUFFIXES)})")
        return self

    @property
    def compiled_sources(self) -> list[BuildSource]:
        # SOL-ExecBench compiles the build folder's top-level files only; nested ones are there to be #included
        # (compiling them too would define their symbols twice when a top-level file includes them)
        return [s for s in self.sources if "/" not in s.path and s.path.endswith(COMPILED_SUFFIXES)]

    @property
    def wanted_libraries(self) -> frozenset[str]:
        """cutlass, cublas, cudnn as named by the languages or the dependencies ('CUTLASS_3_7', 'cublas')."""
        named = set(self.languages) | {m.group(0) for d in self.dependencies if (m := re.match(r"[a-z]+", d.lower()))}
        return frozenset(named & {"cutlass", "cublas", "cudnn"})

    @property
    def names_cuda(self) -> bool:
        """A CUDA language (CUDA C++, CUTLASS, cuDNN, cuBLAS): its .cpp files may use the CUDA runtime's headers
        (ATen/cuda, cudnn.h) even where no .cu file brings nvcc in."""
        return bool(set(self.languages) & {"cuda_cpp", "cutlass", "cudnn", "cublas"})

    @property
    def with_cuda(self) -> bool:
        """torch's rule: nvcc and the CUDA libraries take part when a .cu file is compiled."""
        return any(s.path.endswith(CUDA_SUFFIXES) for s in self.compiled_sources)
