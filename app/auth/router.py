from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from sqlalchemy import select

from app.api.deps import ServicesDep, SessionDep
from app.auth.dependencies import AdminDep, PrincipalDep
from app.auth.keys import create_api_key
from app.auth.principal import Principal
from app.auth.schemas import ApiKeyCreate, ApiKeyCreated, ApiKeyOut
from app.core.db import utcnow
from app.core.errors import ApiError, ErrorBody
from app.models import ApiKey

router = APIRouter(prefix="/v1/api-keys", tags=["auth"])
KeyId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$", description="the key's id (not the key itself)")]


def _out(key: ApiKey) -> ApiKeyOut:
    return ApiKeyOut(
        id=key.id,
        submitter=key.submitter,
        prefix=key.prefix,
        scopes=key.scopes.split(","),
        rate_limit=key.rate_limit,
        created_at=key.created_at,
        revoked_at=key.revoked_at,
    )


def _may_manage(principal: Principal, key: ApiKey) -> bool:
    return principal.is_admin or key.submitter == principal.submitter


@router.post(
    "", status_code=201, response_model=ApiKeyCreated, responses={403: {"model": ErrorBody}, 422: {"model": ErrorBody}}
)
def create_key(body: ApiKeyCreate, _admin: AdminDep, session: SessionDep) -> ApiKeyCreated:
    """Create an API key for a submitter (admin)."""
    key, plaintext = create_api_key(session, body.submitter, tuple(dict.fromkeys(body.scopes)), body.rate_limit)
    session.flush()
    return ApiKeyCreated(id=key.id, submitter=key.submitter, scopes=key.scopes.split(","), key=plaintext)


@router.get("", response_model=list[ApiKeyOut])
def list_keys(principal: PrincipalDep, session: SessionDep) -> list[ApiKeyOut]:
    """API keys, revoked ones included (never the keys themselves): an admin sees every key, others their submitter's."""
    stmt = select(ApiKey).order_by(ApiKey.created_at, ApiKey.id)
    if not principal.is_admin:
        stmt = stmt.where(ApiKey.submitter == principal.submitter)
    return [_out(k) for k in session.scalars(stmt)]


@router.delete("/{key_id}", response_model=ApiKeyOut, responses={404: {"model": ErrorBody}})
def revoke_key(key_id: KeyId, principal: PrincipalDep, services: ServicesDep, session: SessionDep) -> ApiKeyOut:
    """Revoke a key (an admin: any key; others: their submitter's). It stops working at once in this API process and
    within `KAUDIT_KEY_CACHE_S` seconds (default 10) in other API processes, which cache key lookups that long."""
    key = session.get(ApiKey, key_id)
    if key is None or not _may_manage(principal, key):
        raise ApiError(404, f"no API key '{key_id}'")
    if key.revoked_at is None:
        key.revoked_at = utcnow()
        session.flush()
    # this process answers 401 from now on, even to a lookup that raced the commit (the cache is keyed by the hash)
    services.key_cache.forget(key.id)
    services.key_cache.put(key.key_hash, None)
    return _out(key)
