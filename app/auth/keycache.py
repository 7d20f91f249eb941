"""A per-process cache of API key lookups."""

from __future__ import annotations

import time
from collections.abc import Callable

from app.auth.principal import Principal


class KeyCache:
    """hash -> Principal (or None for unknown keys), per process, for `ttl_s`: a revoked key stops working within it."""

    def __init__(
        self, ttl_s: float = 10.0, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ttl, self._max, self._clock = ttl_s, max_entries, clock
        self._entries: dict[str, tuple[float, Principal | None]] = {}

    def get(self, key_hash: str) -> tuple[bool, Principal | None]:
        hit = self._entries.get(key_hash)
        if hit is None or hit[0] < self._clock():
            return False, None
        return True, hit[1]

    def put(self, key_hash: str, principal: Principal | None) -> None:
        if len(self._entries) >= self._max:
            self._entries.clear()
        self._entries[key_hash] = (self._clock() + self._ttl, principal)

    def forget(self, principal_key_id: str) -> None:
        """Drop every cached entry of this key (revocation takes effect at once in this process)."""
        self._entries = {h: v for h, v in self._entries.items() if v[1] is None or v[1].key_id != principal_key_id}
