"""Reading a user's token statistics from bytes, without torch: the API validates an upload with it at POST
time, and the worker (worker.probes.token_stats) turns what it returns into tensors.

The bytes are hostile: a `.npy` header is checked against the bytes that follow it before anything is allocated
(a 100-byte file must not make the reader allocate what its header claims), and a safetensors file is parsed by
the `safetensors` package, which checks its header against its length. Every refusal is a TokenStatsError whose
message says what to change; `field` says which part of the request it concerns (data, kind or key).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import PurePath
from typing import Literal

import numpy as np

Kind = Literal["auto", "histogram", "sample"]
Resolved = Literal["histogram", "sample"]
Format = Literal["npy", "safetensors"]
Field = Literal["data", "kind", "key"]

KINDS: tuple[str, ...] = ("auto", "histogram", "sample")
FORMATS: tuple[str, ...] = ("npy", "safetensors")
# with kind="auto", a tensor under one of these keys is a histogram even if it holds integers (counts)
HISTOGRAM_KEYS = ("histogram", "counts", "hist", "frequencies")
# torch.multinomial, which draws from a histogram, takes at most 2**24 categories
MAX_HISTOGRAM_BINS = 2**24

# safetensors dtype names -> numpy dtypes (little-endian, as the format stores them); BF16 is widened by hand
_SAFETENSORS_DTYPES: dict[str, str] = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U64": "<u8",
    "U32": "<u4",
    "U16": "<u2",
    "U8": "u1",
}


class TokenStatsError(ValueError):
    """The bytes cannot be read as a histogram or a sample of token ids."""

    def __init__(self, message: str, field: Field = "data") -> None:
        super().__init__(message)
        self.field: Field = field


@dataclass(frozen=True)
class ParsedTokenStats:
    """A validated 1-D array as it was sent (no copy): counts (a histogram) or ids >= 0 (a sample, in order)."""

    kind: Resolved
    raw: np.ndarray
    key: str | None  # the safetensors tensor used; None for .npy

    @property
    def entries(self) -> int:
        return int(self.raw.size)

    @property
    def values(self) -> np.ndarray:
        """A writable copy: float64 counts for a histogram, int64 ids for a sample."""
        return self.raw.astype(np.float64 if self.kind == "histogram" else np.int64)


def format_of(name: str | PurePath) -> Format:
    """The format a file name's suffix names; TokenStatsError for anything else."""
    suffix = PurePath(name).suffix.lower()
    if suffix == ".npy":
        return "npy"
    if suffix == ".safetensors":
        return "safetensors"
    raise TokenStatsError("expected a .npy or .safetensors file")


def parse(data: bytes, fmt: Format, kind: Kind = "auto", key: str | None = None) -> ParsedTokenStats:
    """Read and validate token statistics held in `data` (the bytes of a .npy or .safetensors file)."""
    if kind not in KINDS:
        raise TokenStatsError(f"kind must be one of {', '.join(KINDS)}, not '{kind}'", "kind")
    if fmt == "npy":
        if key is not None:
            raise TokenStatsError(
                "key names a tensor of a safetensors file; a .npy file holds one array (leave key out)", "key"
            )
        array = _read_npy(data)
    elif fmt == "safetensors":
        array, key = _read_safetensors(data, key)
    else:
        raise TokenStatsError(f"format must be one of {', '.join(FORMATS)}, not '{fmt}'", "data")
    return _validate(array, kind, key)


def _read_npy(data: bytes) -> np.ndarray:
    fp = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(fp)
        if version == (1, 0):
            shape, _fortran_order, dtype = np.lib.format.read_array_header_1_0(fp)
        elif version == (2, 0):
            shape, _fortran_order, dtype = np.lib.format.read_array_header_2_0(fp)
        else:
            raise TokenStatsError(
                f"a .npy file of format version {version[0]}.{version[1]}; save it with numpy.save "
                "as a plain integer or floating array (format 1.0 or 2.0)"
            )
    except (ValueError, OSError, EOFError) as err:  # bad magic, truncated or unparseable header
        if isinstance(err, TokenStatsError):
            raise
        raise TokenStatsError(f"not a readable .npy array ({err}); save it with numpy.save") from err
    _check_dtype(dtype.kind, str(dtype))
    _check_shape(tuple(shape))
    count = math.prod(shape)
    offset = fp.tell()
    if len(data) - offset != count * dtype.itemsize:
        raise TokenStatsError(
            f"not a readable .npy array: its header announces {count} values "
            f"({count * dtype.itemsize} bytes) but {len(data) - offset} bytes follow it"
        )
    return np.frombuffer(data, dtype=dtype, count=count, offset=offset)


def _read_safetensors(data: bytes, key: str | None) -> tuple[np.ndarray, str]:
    from safetensors import SafetensorError, deserialize

    try:
        tensors = {name: info for name, info in deserialize(data)}
    except (SafetensorError, ValueError, OSError) as err:
        raise TokenStatsError(f"not a readable safetensors file ({err})") from err
    if key is None:
        if len(tensors) != 1:
            raise TokenStatsError(
                f"the file holds tensors {sorted(tensors)[:20]}; name the tensor to use with key", "key"
            )
        key = next(iter(tensors))
    if key not in tensors:
        raise TokenStatsError(f"no tensor '{key[:200]}' in the file (it has {sorted(tensors)[:20]})", "key")
    info = tensors[key]
    name, shape, raw = str(info["dtype"]), tuple(int(n) for n in info["shape"]), info["data"]
    if name == "BOOL":
        _check_dtype("b", "bool")
    if name != "BF16" and name not in _SAFETENSORS_DTYPES:
        raise TokenStatsError(
            f"dtype {name} is not supported; use an integer dtype for ids or a floating one "
            "(F64, F32, F16, BF16) for a histogram"
        )
    _check_shape(shape)
    if name == "BF16":  # numpy has no bfloat16: its bits are the top half of a float32's
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32), key
    return np.frombuffer(raw, dtype=np.dtype(_SAFETENSORS_DTYPES[name])), key


def _check_dtype(kind: str, name: str) -> None:
    if kind not in "iuf":
        raise TokenStatsError(f"dtype {name} is neither integer nor floating; use integer ids or floating counts")


def _check_shape(shape: tuple[int, ...]) -> None:
    if len(shape) != 1 or shape[0] == 0:
        raise TokenStatsError(
            f"expected a non-empty 1-D array, got shape {shape}; flatten it (a sample of ids in "
            "order, or one count per token id)"
        )


def _validate(array: np.ndarray, kind: Kind, key: str | None) -> ParsedTokenStats:
    """Checked on the array as sent (no widened copy: the API validates uploads of up to 16 MiB this way)."""
    floating = array.dtype.kind == "f"
    if kind == "auto":
        kind = "histogram" if floating or (key or "").lower() in HISTOGRAM_KEYS else "sample"
    if kind == "histogram":
        if array.size > MAX_HISTOGRAM_BINS:
            raise TokenStatsError(
                f"a histogram has at most {MAX_HISTOGRAM_BINS} bins (one per token id), not {array.size}"
            )
        with np.errstate(over="ignore", invalid="ignore"):
            finite = not floating or bool(np.isfinite(array).all())
            total = float(array.sum(dtype=np.float64)) if finite else math.nan
        if not math.isfinite(total) or bool((array < 0).any()) or total <= 0:
            raise TokenStatsError("a histogram needs finite, non-negative counts with a positive sum")
        return ParsedTokenStats(kind="histogram", raw=array, key=key)
    if floating:
        raise TokenStatsError(
            f"a sample of token ids must be an integer array, not {array.dtype}; send integer ids, "
            "or kind 'histogram' for counts per id",
            "kind",
        )
    if array.dtype.kind == "i" and int(array.min()) < 0:
        raise TokenStatsError("token ids must be >= 0")
    if array.dtype.kind == "u" and array.dtype.itemsize == 8 and int(array.max()) > np.iinfo(np.int64).max:
        raise TokenStatsError("token ids must be below 2**63")
    return ParsedTokenStats(kind="sample", raw=array, key=key)
