"""FastAPI dependencies: who is calling (API key), rate limits, admin scope."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from fastapi import Depends, HTTPException, Request
from sqlalchemy.orm import Session

from app.auth.keys import find_key


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

    @property
    def is_admin(self) -> bool:
        return "admin" in self.scopes


def _token(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return request.headers.get("x-api-key") or None


def get_principal(request: Request, session: Session = Depends(get_session)) -> Principal:
    token = _token(request)
    if not token:
        raise HTTPException(401, "an API key is required: 'Authorization: Bearer <key>' or 'X-API-Key: <key>'",
                            headers={"WWW-Authenticate": "Bearer"})
    key = find_key(session, token)
    if key is None:
        raise HTTPException(401, "unknown or revoked API key", headers={"WWW-Authenticate": "Bearer"})
    session.rollback()  # end the read transaction: the connection goes back to the pool before the handler's work
    decision = request.app.state.limiter.hit(key.id, key.rate_limit)
    if not decision.allowed:
        raise HTTPException(429, "rate limit exceeded for this API key", headers={"Retry-After": str(decision.retry_after_s)})
    return Principal(key_id=key.id, submitter=key.submitter, scopes=frozenset(key.scopes.split(",")))


def require_admin(principal: Principal = Depends(get_principal)) -> Principal:
    if not principal.is_admin:
        raise HTTPException(403, "this needs an API key with the admin scope")
    return principal
