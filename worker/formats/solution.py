"""solution.json: a kernel for a definition, with its sources."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_SOURCE_BYTES = 1024 * 1024
# target_hardware names -> the kind of device kernel-audit runs them on
_GPU_NAMES = ("cuda", "gpu", "nvidia", "h100", "h200", "h800", "b100", "b200", "gb200", "a100", "a10", "l4", "l40", "rtx", "sm_", "sm8", "sm9")
DeviceKind = Literal["cpu", "cuda"]


class SourceFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(min_length=1)
    content: str

    @field_validator("path")
    @classmethod
    def _relative(cls, v: str) -> str:
        p = PurePosixPath(v)
        if p.is_absolute() or ".." in p.parts or "\\" in v:
            raise ValueError("must be a relative path inside the solution (no '..', no leading '/')")
        return v


class SolutionSpec(BaseModel):
    model_config = ConfigDict(extra="allow")
    language: Literal["python", "triton", "cuda", "cpp"]
    target_hardware: list[str] = Field(default_factory=list)
    entry_point: str = Field(description="'file.py::function'")
    destination_passing_style: bool = True
    binding: str | None = None
    dependencies: list[str] = Field(default_factory=list)
    compile_options: dict[str, object] | list[str] | None = None

    @field_validator("entry_point")
    @classmethod
    def _entry(cls, v: str) -> str:
        if v.count("::") != 1 or not all(v.split("::")):
            raise ValueError("must look like 'file.py::function'")
        return v

    def device_kinds(self) -> tuple[set[DeviceKind], list[str]]:
        """The device kinds target_hardware names, and the names that match none."""
        kinds: set[DeviceKind] = set()
        unknown: list[str] = []
        for name in self.target_hardware:
            n = name.strip().lower()
            if "cpu" in n or n in ("x86", "x86_64", "arm64", "aarch64"):
                kinds.add("cpu")
            elif n.startswith(_GPU_NAMES) or "cuda" in n or "gpu" in n:
                kinds.add("cuda")
            else:
                unknown.append(name)
        return kinds, unknown

    @property
    def entry_file(self) -> str:
        return self.entry_point.split("::")[0]

    @property
    def entry_function(self) -> str:
        return self.entry_point.split("::")[1]


class Solution(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=200)
    definition: str = Field(min_length=1)
    author: str = ""
    description: str = ""
    spec: SolutionSpec
    sources: list[SourceFile] = Field(min_length=1)

    @model_validator(mode="after")
    def _entry_file_present(self) -> "Solution":
        paths = [s.path for s in self.sources]
        if len(set(paths)) != len(paths):
            raise ValueError("sources: two files share one path")
        if self.spec.entry_file not in paths:
            shown = ", ".join(repr(p[:100]) for p in paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
            raise ValueError(f"spec.entry_point: file '{self.spec.entry_file[:200]}' is not among sources ({shown})")
        total = sum(len(s.content.encode()) for s in self.sources)
        if total > MAX_SOURCE_BYTES:
            raise ValueError(f"sources: {total} bytes in all, over the limit of {MAX_SOURCE_BYTES}")
        return self

    def source(self, path: str) -> str:
        return next(s.content for s in self.sources if s.path == path)
