"""Per-key rate limits with `limits` (Redis storage in production, memory on the embedded default)."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

from limits import parse
from limits.storage import storage_from_string
from limits.strategies import FixedWindowRateLimiter

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    retry_after_s: int = 0


class RateLimiter:
    def __init__(self, storage_url: str, default: str) -> None:
        options = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5} if storage_url.startswith("redis") else {}
        self._limiter = FixedWindowRateLimiter(storage_from_string(storage_url, **options))
        self._default = default

    def hit(self, key_id: str, limit: str | None = None) -> RateDecision:
        try:
            item = parse(limit or self._default)
            if self._limiter.hit(item, "key", key_id):
                return RateDecision(True)
            reset_at, _remaining = self._limiter.get_window_stats(item, "key", key_id)
        except Exception as err:  # noqa: BLE001 - the limiter's store being down must not take the API down
            log.warning("rate limiter unavailable, allowing: %s", err)
            return RateDecision(True)
        return RateDecision(False, max(1, math.ceil(reset_at - time.time())))
