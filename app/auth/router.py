from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import SessionDep
from app.auth.dependencies import AdminDep
from app.auth.keys import create_api_key
from app.auth.schemas import ApiKeyCreate, ApiKeyCreated

router = APIRouter(prefix="/v1/api-keys", tags=["auth"])


@router.post("", status_code=201, response_model=ApiKeyCreated)
def create_key(body: ApiKeyCreate, _admin: AdminDep, session: SessionDep) -> ApiKeyCreated:
    """Create an API key for a submitter (admin)."""
    key, plaintext = create_api_key(session, body.submitter, tuple(dict.fromkeys(body.scopes)), body.rate_limit)
    session.flush()
    return ApiKeyCreated(id=key.id, submitter=key.submitter, scopes=key.scopes.split(","), key=plaintext)
