"""The dtype names the formats use, mapped to torch dtypes."""

from __future__ import annotations

from typing import Literal

import torch

DTypeName = Literal[
    "float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",
    "int64", "int32", "int16", "int8", "uint8", "bool",
]

_TORCH: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}


def to_torch(name: str) -> torch.dtype:
    return _TORCH[name]


def is_floating(name: str) -> bool:
    return to_torch(name).is_floating_point
