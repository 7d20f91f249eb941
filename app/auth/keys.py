"""API keys: shown once, stored only as a sha256 hash."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.models import ApiKey

KEY_PREFIX = "ka_"


def hash_key(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def create_api_key(
    session: Session, submitter: str, scopes: tuple[str, ...] = ("submit",), rate_limit: str | None = None
) -> tuple[ApiKey, str]:
    plaintext = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(
        submitter=submitter,
        prefix=plaintext[:10],
        key_hash=hash_key(plaintext),
        scopes=",".join(scopes),
        rate_limit=rate_limit,
    )
    session.add(key)
    session.flush()
    return key, plaintext


def find_key(session: Session, plaintext: str) -> ApiKey | None:
    key = session.scalar(select(ApiKey).where(ApiKey.key_hash == hash_key(plaintext)))
    if key is None or key.revoked_at is not None:
        return None
    return key
