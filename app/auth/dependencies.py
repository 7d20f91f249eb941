"""FastAPI dependencies: who is calling (API key), rate limits, admin scope."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request
from starlette.concurrency import run_in_threadpool

from app.api.deps import Services, ServicesDep
from app.auth.keys import find_key, hash_key
from app.auth.principal import Principal


def _token(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return request.headers.get("x-api-key") or None


def _lookup(services: Services, plaintext: str) -> Principal | None:
    with services.sessions() as session:
        key = find_key(session, plaintext)
        if key is None:
            return None
        return Principal(
            key_id=key.id, submitter=key.submitter, scopes=frozenset(key.scopes.split(",")), rate_limit=key.rate_limit
        )


async def principal_for(services: Services, token: str) -> Principal | None:
    """The live key's principal (cached per process for KAUDIT_KEY_CACHE_S); None for an unknown or revoked key."""
    cache = services.key_cache
    digest = hash_key(token)
    found, principal = cache.get(digest)
    if not found:
        principal = await run_in_threadpool(_lookup, services, token)
        cache.put(digest, principal)
    return principal


async def get_principal(request: Request, services: ServicesDep) -> Principal:
    """The key comes only in a header: a key in the query string would be written to access logs and browser
    history, so `?key=` or `?api_key=` authenticates nothing."""
    token = _token(request)
    if not token:
        raise HTTPException(
            401,
            "an API key is required: 'Authorization: Bearer <key>' or 'X-API-Key: <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    principal = await principal_for(services, token)
    if principal is None:
        raise HTTPException(401, "unknown or revoked API key", headers={"WWW-Authenticate": "Bearer"})
    decision = services.limiter.hit(principal.key_id, principal.rate_limit)
    if not decision.allowed:
        raise HTTPException(
            429, "rate limit exceeded for this API key", headers={"Retry-After": str(decision.retry_after_s)}
        )
    return principal


def require_admin(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    if not principal.is_admin:
        raise HTTPException(403, "this needs an API key with the admin scope")
    return principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]
AdminDep = Annotated[Principal, Depends(require_admin)]
