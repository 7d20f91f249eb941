"""FastAPI dependencies: who is calling (API key), rate limits, admin scope."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from fastapi import Depends, HTTPException, Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from app.auth.keys import find_key, hash_key


def get_session(request: Request) -> Iterator[Session]:
    session = request.app.state.sessions()
    try:
        yield session
    finally:
        session.close()


@dataclass(frozen=True)
class Principal:
    key_id: str
    submitter: str
    scopes: frozenset[str]
    rate_limit: str | None = None

    @property
    def is_admin(self) -> bool:
        return "admin" in self.scopes


class KeyCache:
    """hash -> Principal (or None for unknown keys), per process, for `ttl_s`: a revoked key stops working within it."""

    def __init__(self, ttl_s: float = 10.0, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
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


def _token(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return request.headers.get("x-api-key") or None


def _lookup(request: Request, plaintext: str) -> Principal | None:
    with request.app.state.sessions() as session:
        key = find_key(session, plaintext)
        if key is None:
            return None
        return Principal(key_id=key.id, submitter=key.submitter, scopes=frozenset(key.scopes.split(",")), rate_limit=key.rate_limit)


async def get_principal(request: Request) -> Principal:
    token = _token(request)
    if not token:
        raise HTTPException(401, "an API key is required: 'Authorization: Bearer <key>' or 'X-API-Key: <key>'",
                            headers={"WWW-Authenticate": "Bearer"})
    cache: KeyCache = request.app.state.key_cache
    digest = hash_key(token)
    found, principal = cache.get(digest)
    if not found:
        principal = await run_in_threadpool(_lookup, request, token)
        cache.put(digest, principal)
    if principal is None:
        raise HTTPException(401, "unknown or revoked API key", headers={"WWW-Authenticate": "Bearer"})
    decision = request.app.state.limiter.hit(principal.key_id, principal.rate_limit)
    if not decision.allowed:
        raise HTTPException(429, "rate limit exceeded for this API key", headers={"Retry-After": str(decision.retry_after_s)})
    return principal


def require_admin(principal: Principal = Depends(get_principal)) -> Principal:
    if not principal.is_admin:
        raise HTTPException(403, "this needs an API key with the admin scope")
    return principal
