"""One line of workload.jsonl: var axis values and how to make each input."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class RandomInput(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["random"]


class ScalarInput(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["scalar"]
    value: int | float | bool


class SafetensorsInput(BaseModel):
    """A tensor stored in a .safetensors file, at `path` relative to the definition's folder (SOL-ExecBench: relative
    to its trace set's root), under `tensor_key`."""

    model_config = ConfigDict(extra="allow")
    type: Literal["safetensors"]
    path: str = Field(min_length=1)
    tensor_key: str = Field(min_length=1)

    @field_validator("path")
    @classmethod
    def _relative(cls, v: str) -> str:
        # the file is read from beside the definition: a path that leaves that folder reads whatever it names
        p = PurePosixPath(v)
        if p.is_absolute() or ".." in p.parts or "\\" in v or "\x00" in v:
            raise ValueError(
                "must be a relative path inside the definition's folder (no '..', no leading '/', no '\\')"
            )
        return v


class CustomInput(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["custom"]


WorkloadInput = Annotated[RandomInput | ScalarInput | SafetensorsInput | CustomInput, Field(discriminator="type")]


class Workload(BaseModel):
    model_config = ConfigDict(extra="allow")
    uuid: str = Field(min_length=1)
    axes: dict[str, int] = Field(default_factory=dict)
    inputs: dict[str, WorkloadInput]
    tolerance: dict[str, float] | None = None
