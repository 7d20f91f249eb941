"""Bring your own distribution: a user's token statistics for the id-like inputs of the probes.

A file holds either a histogram (count or frequency per token id) or a sample of token ids
(a stretch of tokenized text, in order). `.npy` or `.safetensors`; a safetensors file must hold
one tensor, or name the one to use with `key`. With `kind="auto"`, a floating array or a tensor
keyed `histogram`/`counts` is a histogram and an integer array is a sample of ids.

Where the probes would draw real-text ids from the built-in English corpus, they draw from these
statistics instead: a histogram is sampled i.i.d.; a sample is read as a contiguous window (so bursts
of repeated ids survive). Ids at or above the probe's id range are folded into it (id % high) and
the count folded is reported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

_HISTOGRAM_KEYS = ("histogram", "counts", "hist", "frequencies")


class TokenStatsError(ValueError):
    """The token statistics file cannot be read as a histogram or a sample of ids."""


class TokenStats(BaseModel):
    """The audit option: where the user's token statistics are and how to read them."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    path: Path
    kind: Literal["auto", "histogram", "sample"] = "auto"
    key: str | None = Field(None, description="safetensors: the tensor to use (default: the only one)")

    def load(self) -> "LoadedTokenStats":
        tensor, key = _read(self.path, self.key)
        if tensor.dim() != 1 or tensor.numel() == 0:
            raise TokenStatsError(f"{self.path}: expected a non-empty 1-D array, got shape {tuple(tensor.shape)}")
        kind = self.kind
        if kind == "auto":
            is_hist = tensor.dtype.is_floating_point or (key or "").lower() in _HISTOGRAM_KEYS
            kind = "histogram" if is_hist else "sample"
        if kind == "histogram":
            weights = tensor.to(torch.float64)
            if not bool(torch.isfinite(weights).all()) or bool((weights < 0).any()) or float(weights.sum()) <= 0:
                raise TokenStatsError(f"{self.path}: a histogram needs finite, non-negative counts with a positive sum")
            return LoadedTokenStats(source=str(self.path), kind="histogram", values=weights)
        if tensor.dtype.is_floating_point or tensor.dtype == torch.bool:
            raise TokenStatsError(f"{self.path}: a sample of token ids must be an integer array, not {tensor.dtype}")
        ids = tensor.to(torch.int64)
        if bool((ids < 0).any()):
            raise TokenStatsError(f"{self.path}: token ids must be >= 0")
        return LoadedTokenStats(source=str(self.path), kind="sample", values=ids)


def _read(path: Path, key: str | None) -> tuple[torch.Tensor, str | None]:
    if not path.is_file():
        raise TokenStatsError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        import numpy as np

        try:
            array = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as err:
            raise TokenStatsError(f"{path}: not a readable .npy array ({err})") from err
        if array.dtype.kind not in "iuf":
            raise TokenStatsError(f"{path}: dtype {array.dtype} is neither integer nor floating")
        return torch.from_numpy(array.astype(np.float64 if array.dtype.kind == "f" else np.int64)), None
    if suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            tensors = load_file(str(path))
        except (SafetensorError, OSError) as err:
            raise TokenStatsError(f"{path}: not a readable safetensors file ({err})") from err
        if key is None:
            if len(tensors) != 1:
                raise TokenStatsError(f"{path}: holds {sorted(tensors)}; name the tensor to use")
            key = next(iter(tensors))
        if key not in tensors:
            raise TokenStatsError(f"{path}: no tensor '{key}' (has {sorted(tensors)})")
        return tensors[key], key
    raise TokenStatsError(f"{path}: expected a .npy or .safetensors file")


class LoadedTokenStats(BaseModel):
    """The statistics in memory, and how ids are drawn from them."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)
    source: str
    kind: Literal["histogram", "sample"]
    values: torch.Tensor

    def draw(self, n: int, high: int, gen: torch.Generator) -> tuple[torch.Tensor, int]:
        """`n` ids in [0, high) and how many were folded into range (id % high)."""
        if self.kind == "histogram":
            ids = torch.multinomial(self.values / self.values.sum(), n, replacement=True, generator=gen)
        else:
            stream = self.values
            if stream.numel() <= n:
                stream = stream.repeat(n // stream.numel() + 2)
            offset = int(torch.randint(0, stream.numel() - n, (1,), generator=gen))
            ids = stream[offset : offset + n].clone()
        folded = int((ids >= high).sum())
        return ids % high, folded

    def describe(self) -> dict[str, object]:
        size = int(self.values.numel())
        return {"source": self.source, "kind": self.kind, ("bins" if self.kind == "histogram" else "ids"): size}
