"""solution.json: a kernel for a definition, with its sources (SOL-ExecBench's form, and kernel-audit's older one).

SOL-ExecBench's spec (core/data/solution.py, BuildSpec):
  languages                  list of pytorch, triton, cute_dsl, cutile, cudnn_frontend (Python-loaded) or
                             cuda_cpp, cutlass, cudnn, cublas (compiled C++); the two families are not mixed
  target_hardware            e.g. ["B200", "LOCAL"]; LOCAL is whatever machine runs it (worker.formats.hardware)
  entry_point                "{file_path}::{function_name}"; the file is one of the sources, a .py for the Python
                             family, a C/C++/CUDA file for the C++ one (whose function is the name the built
                             extension exports, e.g. `m.def("run", ...)` in PYBIND11_MODULE)
  dependencies               e.g. ["CUTLASS_3_7", "cublas", "torch"]; declarative (SOL-ExecBench enforces none)
  pip_packages               extra Python requirements SOL-ExecBench installs before a run
  destination_passing_style  default true: outputs are passed, pre-allocated, after the inputs
  binding                    "torch" (the only one) or null, which means torch for the C++ family; ignored for Python
  compile_options            {cflags, cuda_cflags, ld_flags}, added to the evaluator's own flags; defaults
                             cflags [], cuda_cflags ["-O3", "--use_fast_math"], ld_flags ["-lcuda"]

The older form's `spec.language` (python|triton|cuda|cpp; kernel-audit's and SOL-ExecBench's own earlier schema) is
still read, mapped to `languages` (a Python solution's GPU DSL from its dependencies), and leaves a note in
`compat_notes` for the report. A model always dumps SOL-ExecBench's form.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import PurePosixPath
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from worker.formats.hardware import DeviceKind, device_kinds
from worker.formats.languages import (
    CPP_LANGUAGES,
    CPP_SUFFIXES,
    LANGUAGES,
    LEGACY_LANGUAGES,
    PYTHON_LANGUAGES,
    PYTHON_SUFFIXES,
    Language,
    LanguageFamily,
    family_of,
    gpu_only,
    legacy_languages,
    legacy_note,
)

MAX_SOURCE_BYTES = 1024 * 1024

Binding = Literal["torch"]

# SOL-ExecBench's CompileOptions defaults (added to the evaluator's own flags, not replacing them)
DEFAULT_CFLAGS: Final[tuple[str, ...]] = ()
DEFAULT_CUDA_CFLAGS: Final[tuple[str, ...]] = ("-O3", "--use_fast_math")
DEFAULT_LD_FLAGS: Final[tuple[str, ...]] = ("-lcuda",)


def check_source_path(path: str) -> str:
    """`path` if it is already in canonical relative form, else ValueError saying what is wrong.

    The static scan reads a source by the name the model holds and the sandbox writes it by that same name,
    so a name that two spellings can reach (`k.py` and `k.py/`, `./k.py`, `a//k.py`) would let one file be
    scanned and another written over it. Only the one spelling PurePosixPath would give back is accepted."""
    if not path:
        return _bad("is empty")
    if "\x00" in path:
        return _bad("contains a NUL character")
    if "\\" in path:
        return _bad("contains '\\': separate folders with '/'")
    if path.startswith("/"):
        return _bad("is absolute: give a path relative to the solution folder")
    if path.endswith("/"):
        return _bad("ends with '/': a source is a file, not a folder")
    parts = path.split("/")
    if "" in parts:
        return _bad("has an empty part ('//')")
    if "." in parts:
        return _bad("has a '.' part: write the path without './'")
    if ".." in parts:
        return _bad("has a '..' part: a source must stay inside the solution folder")
    if str(PurePosixPath(path)) != path:  # nothing above missed a spelling PurePosixPath would rewrite
        return _bad(f"is not in canonical form ('{PurePosixPath(path)}')")
    return path


def _bad(reason: str) -> str:
    raise ValueError(f"must be a relative path inside the solution: it {reason}")


def _alias_key(path: str) -> str:
    """The file a path names once normalised, for finding two spellings of one file before either is refused."""
    return str(PurePosixPath(path.replace("\\", "/")))


def _check_aliases(sources: list[Any]) -> None:
    """Two sources that name one file (after normalisation, case-sensitively), or a file that is also the folder
    of another: refused, naming both, before the per-path checks (whose message would hide the collision)."""
    keyed: list[tuple[int, str, str]] = []
    for i, src in enumerate(sources):
        path = src.get("path") if isinstance(src, dict) else getattr(src, "path", None)
        if isinstance(path, str) and path:
            keyed.append((i, path, _alias_key(path)))
    first: dict[str, tuple[int, str]] = {}
    for i, path, key in keyed:
        if key in first:
            j, other = first[key]
            same = "is the same path as" if path == other else f"names the same file ('{key[:200]}') as"
            raise ValueError(
                f"sources.{i}.path: '{path[:200]}' {same} sources.{j}.path '{other[:200]}': the sandbox "
                "would write one over the other, and the static scan would read only one of them"
            )
        first[key] = (i, path)
    for i, path, key in keyed:
        for parent in PurePosixPath(key).parents:
            hit = first.get(str(parent))
            if hit is not None and str(parent) != ".":
                j, other = hit
                raise ValueError(
                    f"sources.{i}.path: '{path[:200]}' puts a file inside sources.{j}.path "
                    f"'{other[:200]}', which is a file: a path cannot be both a file and a folder"
                )


class SourceFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(min_length=1, description="relative path in canonical form, e.g. 'kernel.py' or 'src/kernel.cu'")
    content: str

    @field_validator("path")
    @classmethod
    def _relative(cls, v: str) -> str:
        return check_source_path(v)


class CompileOptions(BaseModel):
    """Flags for the C++ family's build, appended to the evaluator's own (SOL-ExecBench's defaults when absent)."""

    # a misspelt key would silently drop the author's flags from the build
    model_config = ConfigDict(extra="forbid")
    cflags: list[str] = Field(default_factory=lambda: list(DEFAULT_CFLAGS), description="g++ flags, e.g. -O3")
    cuda_cflags: list[str] = Field(
        default_factory=lambda: list(DEFAULT_CUDA_CFLAGS),
        description="nvcc flags, e.g. -use_fast_math, --maxrregcount=64, -arch=sm_90",
    )
    ld_flags: list[str] = Field(
        default_factory=lambda: list(DEFAULT_LD_FLAGS), description="linker flags, e.g. -lcublas"
    )


def read_older_spec(spec: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The spec in SOL-ExecBench's form, and the notes saying what was read from the older single-language form."""
    if "language" not in spec:
        return spec, []
    spec = dict(spec)
    old = spec.pop("language")
    if "languages" in spec:
        raise ValueError(
            "spec.language: give spec.languages only (SOL-ExecBench's form), not both it and spec.language"
        )
    if not isinstance(old, str) or old not in LEGACY_LANGUAGES:
        shown = repr(old)[:100]
        raise ValueError(
            f"spec.language: {shown} is not one of the older form's python, triton, cuda, cpp; SOL-ExecBench's "
            f"form is spec.languages, a list of {', '.join(LANGUAGES)}"
        )
    new = legacy_languages(old, spec.get("dependencies"))
    spec["languages"] = list(new)
    return spec, [legacy_note(old, new)]


class SolutionSpec(BaseModel):
    model_config = ConfigDict(extra="allow")
    languages: list[Language] = Field(
        min_length=1, description="SOL-ExecBench's languages; Python and C++ ones are not mixed"
    )
    target_hardware: list[str] = Field(
        default_factory=list, description="e.g. B200, H100, LOCAL (any); none: the default"
    )
    entry_point: str = Field(description="'file.py::function', or for C++ 'kernel.cu::function' it exports")
    destination_passing_style: bool = True
    binding: Binding | None = Field(default=None, description="torch, or null (torch for the C++ family)")
    dependencies: list[str] = Field(default_factory=list, description="e.g. CUTLASS_3_7, cublas, cudnn, torch")
    pip_packages: list[str] = Field(default_factory=list)
    compile_options: CompileOptions | None = None
    # what was read from kernel-audit's older form; computed here, never taken from the file, never dumped
    compat_notes: SkipJsonSchema[list[str]] = Field(default_factory=list, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _older_form(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if k != "compat_notes"}
        data, notes = read_older_spec(data)
        return {**data, "compat_notes": notes}

    @field_validator("entry_point")
    @classmethod
    def _entry(cls, v: str) -> str:
        if v.count("::") != 1 or not all(v.split("::")):
            raise ValueError("must look like 'file.py::function' (or 'kernel.cu::function' for C++)")
        check_source_path(v.split("::")[0])
        return v

    @model_validator(mode="after")
    def _languages(self) -> SolutionSpec:
        if len(set(self.languages)) != len(self.languages):
            raise ValueError(f"spec.languages: {self.languages} names a language twice")
        python = [lang for lang in self.languages if lang in PYTHON_LANGUAGES]
        cpp = [lang for lang in self.languages if lang in CPP_LANGUAGES]
        if python and cpp:
            raise ValueError(
                f"spec.languages: Python-loaded {python} and compiled C++ {cpp} cannot be mixed in one solution"
            )
        suffixes = CPP_SUFFIXES if cpp else PYTHON_SUFFIXES
        if not self.entry_file.endswith(suffixes):
            kind = "a C/C++/CUDA file" if cpp else "a .py file"
            raise ValueError(
                f"spec.entry_point: languages {self.languages} need {kind} as the entry file "
                f"({', '.join(suffixes)}), not '{self.entry_file[:200]}'"
            )
        return self

    @property
    def entry_file(self) -> str:
        return self.entry_point.split("::")[0]

    @property
    def entry_function(self) -> str:
        return self.entry_point.split("::")[1]

    @property
    def family(self) -> LanguageFamily:
        return family_of(self.languages)

    @property
    def is_python(self) -> bool:
        """Imported as a Python module: pytorch, triton, cute_dsl, cutile, cudnn_frontend."""
        return self.family == "python"

    @property
    def is_cpp(self) -> bool:
        """Compiled into an extension first: cuda_cpp, cutlass, cudnn, cublas."""
        return self.family == "cpp"

    @property
    def gpu_languages(self) -> list[Language]:
        """The declared languages that run only on a CUDA device (all but pytorch and triton)."""
        return gpu_only(self.languages)

    @property
    def needs_gpu(self) -> bool:
        return bool(self.gpu_languages)

    @property
    def effective_binding(self) -> Binding | None:
        """torch for the C++ family (SOL-ExecBench's default when binding is null); None for Python-loaded code."""
        return (self.binding or "torch") if self.is_cpp else None

    @property
    def effective_compile_options(self) -> CompileOptions:
        """The flags a C++ build adds to its own: compile_options, or SOL-ExecBench's defaults when absent."""
        return self.compile_options or CompileOptions()

    def device_kinds(self) -> tuple[set[DeviceKind], list[str]]:
        """The device kinds target_hardware names (LOCAL: any), and the names kernel-audit does not know."""
        return device_kinds(self.target_hardware)


class Solution(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=200)
    definition: str = Field(min_length=1)
    author: str = ""
    description: str = ""
    spec: SolutionSpec
    sources: list[SourceFile] = Field(min_length=1)
    # what the report should say about how the file was read (the older form, a rebound definition name);
    # computed, never taken from the file, never dumped (nor offered in the API's schema)
    compat_notes: SkipJsonSchema[list[str]] = Field(default_factory=list, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _raw(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if k != "compat_notes"}
        notes: list[str] = []
        if isinstance(data.get("spec"), dict):  # read here so an error names spec.language at the top level
            spec, notes = read_older_spec(data["spec"])
            data["spec"] = spec
        if data.get("description", "") is None:  # SOL-ExecBench's default is null
            data["description"] = ""
        if isinstance(data.get("sources"), list):
            _check_aliases(data["sources"])
        return {**data, "compat_notes": notes}

    @model_validator(mode="after")
    def _entry_file_present(self) -> Solution:
        self.compat_notes = _unique([*self.compat_notes, *self.spec.compat_notes])
        paths = [s.path for s in self.sources]
        if self.spec.entry_file not in paths:
            shown = ", ".join(repr(p[:100]) for p in paths[:5]) + (
                f" and {len(paths) - 5} more" if len(paths) > 5 else ""
            )
            raise ValueError(f"spec.entry_point: file '{self.spec.entry_file[:200]}' is not among sources ({shown})")
        total = sum(len(s.content.encode()) for s in self.sources)
        if total > MAX_SOURCE_BYTES:
            raise ValueError(f"sources: {total} bytes in all, over the limit of {MAX_SOURCE_BYTES}")
        return self

    def source(self, path: str) -> str:
        return next(s.content for s in self.sources if s.path == path)

    def for_definition(self, name: str, why: str) -> Solution:
        """This solution audited against the definition `name` (SOL-ExecBench pairs a solution with whatever
        definition it is run with; its `definition` field is not checked), with a note saying so."""
        if name == self.definition:
            return self
        note = f"solution.definition is '{self.definition[:200]}'; audited against the definition '{name}' ({why})"
        return self.model_copy(update={"definition": name, "compat_notes": [*self.compat_notes, note]})


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))
