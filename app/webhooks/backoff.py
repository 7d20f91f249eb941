"""When to try a failed delivery again: exponential backoff with jitter ("equal jitter")."""

from __future__ import annotations

import random


def retry_delay_s(failed_attempts: int, base_s: float, max_s: float, rng: random.Random | None = None) -> float:
    """Delay after the `failed_attempts`-th failure: half of min(max_s, base_s * 2**(n-1)) plus a uniform random
    part up to the other half, so delays grow, stay under max_s, and endpoints that failed together spread out."""
    ceiling = min(max_s, base_s * 2.0 ** max(failed_attempts - 1, 0))
    return ceiling / 2 + (rng or random.Random()).uniform(0, ceiling / 2)
