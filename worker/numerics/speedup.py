"""A speedup with its confidence interval, from kernel and reference timings taken in interleaved blocks.

The benchmark stage times the two sides in alternating blocks (kernel block 1, reference block 1, kernel block 2,
...), so whatever drifts on the host while it measures (clocks, temperature, a neighbour's burst) reaches both sides
of a block alike. The speedup is the ratio of medians over every timed call: median(reference) / median(kernel).

Its interval is a percentile bootstrap in two levels: whole blocks are drawn with replacement, a block's kernel and
reference calls together (paired: the drift they share cancels in the ratio), then the calls inside each drawn block
are drawn with replacement. The first level carries the variation between blocks, the second the noise within one;
drawing calls alone, as if every call were independent, would miss a slow block and give too narrow an interval.
The generator is seeded (the audit's seed), so a stored interval can be recomputed from the stored times.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, Field

LEVEL = 0.95
RESAMPLES = 2000
METHOD = "ratio of medians; paired two-level (blocks, then calls) percentile bootstrap"


class SpeedupInterval(BaseModel):
    speedup: float = Field(gt=0, description="median(reference) / median(kernel) over every timed call")
    lo: float = Field(gt=0)
    hi: float = Field(gt=0)
    level: float = LEVEL
    blocks: int = Field(ge=1)
    resamples: int = Field(ge=0)
    method: str = METHOD

    @property
    def rel_width(self) -> float:
        """(hi - lo) / speedup: what the re-time threshold compares."""
        return (self.hi - self.lo) / self.speedup

    @property
    def ci(self) -> list[float]:
        return [self.lo, self.hi]


def _checked(blocks: Sequence[Sequence[float]], side: str) -> list[list[float]]:
    out = [[float(t) for t in b] for b in blocks]
    if not out or any(not b for b in out):
        raise ValueError(f"{side}: every block needs at least one timing")
    if not all(math.isfinite(t) and t > 0 for b in out for t in b):
        raise ValueError(f"{side}: timings must be finite and positive")
    return out


def _padded(blocks: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
    width = max(len(b) for b in blocks)
    values = np.full((len(blocks), width), np.nan)
    for i, b in enumerate(blocks):
        values[i, : len(b)] = b
    return values, np.array([len(b) for b in blocks], dtype=np.intp)


def _resampled_medians(
    values: np.ndarray, lengths: np.ndarray, picks: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """For each row of `picks` (block indices), the median of the calls drawn with replacement inside each block."""
    resamples, n_blocks = picks.shape
    width = values.shape[1]
    chosen = lengths[picks]  # (R, B): how many calls the drawn block has
    within = np.floor(rng.random((resamples, n_blocks, width)) * chosen[..., None]).astype(np.intp)
    drawn = values[picks[..., None], within]
    # a block shorter than the widest draws only as many calls as it has: the padding is left out of the median
    drawn[np.arange(width)[None, None, :] >= chosen[..., None]] = np.nan
    return np.nanmedian(drawn.reshape(resamples, n_blocks * width), axis=1)


def speedup_interval(
    kernel_blocks: Sequence[Sequence[float]],
    reference_blocks: Sequence[Sequence[float]],
    *,
    seed: int,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
) -> SpeedupInterval:
    """The speedup of the kernel over the reference with its `level` interval (see the module's docstring).

    Block i of each side must have been timed next to block i of the other. One block gives no variation between
    blocks to draw from; its interval then reflects the noise inside it only."""
    kernel, reference = _checked(kernel_blocks, "kernel"), _checked(reference_blocks, "reference")
    if len(kernel) != len(reference):
        raise ValueError(f"{len(kernel)} kernel blocks but {len(reference)} reference blocks: they must pair up")
    if not 0 < level < 1:
        raise ValueError("level must lie in (0, 1)")
    point = float(np.median([t for b in reference for t in b]) / np.median([t for b in kernel for t in b]))
    rng = np.random.Generator(np.random.PCG64(seed & (2**63 - 1)))
    n = len(kernel)
    picks = rng.integers(0, n, size=(resamples, n))
    k_vals, k_len = _padded(kernel)
    r_vals, r_len = _padded(reference)
    ratios = _resampled_medians(r_vals, r_len, picks, rng) / _resampled_medians(k_vals, k_len, picks, rng)
    alpha = 1.0 - level
    lo, hi = (float(q) for q in np.quantile(ratios, [alpha / 2, 1 - alpha / 2]))
    # a percentile interval of a skewed statistic can, rarely, leave out the estimate itself: widen it to include it
    return SpeedupInterval(
        speedup=point, lo=min(lo, point), hi=max(hi, point), level=level, blocks=n, resamples=resamples
    )
