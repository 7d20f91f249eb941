"""Bring your own distribution: a user's token statistics for the id-like inputs of the probes.

A file holds either a histogram (count or frequency per token id) or a sample of token ids
(a stretch of tokenized text, in order). `.npy` or `.safetensors`; a safetensors file must hold
one tensor, or name the one to use with `key`. With `kind="auto"`, a floating array or a tensor
keyed `histogram`/`counts` is a histogram and an integer array is a sample of ids.

Where the probes would draw real-text ids from the built-in English corpus, they draw from these
statistics instead: a histogram is sampled i.i.d.; a sample is read as a contiguous window (so bursts
of repeated ids survive). Ids at or above the probe's id range are folded into it (id % high) and
the count folded is reported. The canary trains on them too (worker.canary.data.canary_text).

The bytes are read by worker.probes.token_stats_read (no torch), the same reader the API validates an
upload with at POST: `TokenStats` reads a file (the CLI's --token-stats), `LoadedTokenStats.from_bytes`
the bytes stored with a submission (the worker).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from worker.probes.token_stats_read import (
    HISTOGRAM_KEYS,
    Format,
    Kind,
    ParsedTokenStats,
    TokenStatsError,
    format_of,
    parse,
)

__all__ = ["HISTOGRAM_KEYS", "LoadedTokenStats", "TokenStats", "TokenStatsError"]


class TokenStats(BaseModel):
    """The audit option: where the user's token statistics are and how to read them."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    path: Path
    kind: Literal["auto", "histogram", "sample"] = "auto"
    key: str | None = Field(None, description="safetensors: the tensor to use (default: the only one)")

    def load(self) -> "LoadedTokenStats":
        try:
            fmt = format_of(self.path)
            if not self.path.is_file():
                raise TokenStatsError("no such file")
            data = self.path.read_bytes()
        except TokenStatsError as err:
            raise TokenStatsError(f"{self.path}: {err}", err.field) from None
        except OSError as err:
            raise TokenStatsError(f"{self.path}: cannot read it ({err.strerror or err})") from err
        return LoadedTokenStats.from_bytes(data, fmt, self.kind, self.key, source=str(self.path))


class LoadedTokenStats(BaseModel):
    """The statistics in memory, and how ids are drawn from them."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)
    source: str
    kind: Literal["histogram", "sample"]
    values: torch.Tensor

    @classmethod
    def from_bytes(
        cls, data: bytes, fmt: Format, kind: Kind = "auto", key: str | None = None, *, source: str
    ) -> "LoadedTokenStats":
        """The statistics in `data` (a .npy or .safetensors file's bytes); TokenStatsError names what is wrong,
        prefixed by `source`."""
        try:
            parsed = parse(data, fmt, kind, key)
        except TokenStatsError as err:
            raise TokenStatsError(f"{source}: {err}", err.field) from None
        return cls.from_parsed(parsed, source=source)

    @classmethod
    def from_parsed(cls, parsed: ParsedTokenStats, *, source: str) -> "LoadedTokenStats":
        return cls(source=source, kind=parsed.kind, values=torch.from_numpy(parsed.values))

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
