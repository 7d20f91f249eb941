"""The dtype names the formats use (no torch here: the API process validates formats without loading it)."""

from __future__ import annotations

from typing import Literal, get_args

DTypeName = Literal[
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
]

DTYPE_NAMES: tuple[str, ...] = get_args(DTypeName)
FLOAT_DTYPES: frozenset[str] = frozenset(n for n in DTYPE_NAMES if n.startswith("float") or n == "bfloat16")
