"""One line of workload.jsonl: var axis values and how to make each input."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class RandomInput(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["random"]


class ScalarInput(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["scalar"]
    value: int | float | bool


class SafetensorsInput(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["safetensors"]
    path: str
    tensor_key: str


class CustomInput(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["custom"]


WorkloadInput = Annotated[
    RandomInput | ScalarInput | SafetensorsInput | CustomInput, Field(discriminator="type")
]


class Workload(BaseModel):
    model_config = ConfigDict(extra="allow")
    uuid: str = Field(min_length=1)
    axes: dict[str, int] = Field(default_factory=dict)
    inputs: dict[str, WorkloadInput]
    tolerance: dict[str, float] | None = None
