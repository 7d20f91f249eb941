"""A small per-process cache of rendered responses (leaderboards), each entry fresh for `ttl_s`."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable


class ResponseCache:
    def __init__(self, ttl_s: float, max_entries: int = 1000, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl, self._max, self._clock = ttl_s, max_entries, clock
        self._entries: dict[Hashable, tuple[float, bytes]] = {}

    def get(self, key: Hashable) -> bytes | None:
        hit = self._entries.get(key)
        return hit[1] if hit is not None and hit[0] >= self._clock() else None

    def put(self, key: Hashable, body: bytes) -> None:
        if self._ttl <= 0:
            return
        if len(self._entries) >= self._max:
            self._entries.clear()
        self._entries[key] = (self._clock() + self._ttl, body)
