from __future__ import annotations

from fastapi import APIRouter, Depends
from sqlalchemy.orm import Session

from app.auth.dependencies import Principal, get_session, require_admin
from app.auth.keys import create_api_key
from app.auth.schemas import ApiKeyCreate, ApiKeyCreated

router = APIRouter(prefix="/v1/api-keys", tags=["auth"])


@router.post("", status_code=201, response_model=ApiKeyCreated)
def create_key(body: ApiKeyCreate, _admin: Principal = Depends(require_admin), session: Session = Depends(get_session)) -> ApiKeyCreated:
    """Create an API key for a submitter (admin)."""
    key, plaintext = create_api_key(session, body.submitter, tuple(dict.fromkeys(body.scopes)), body.rate_limit)
    session.commit()
    return ApiKeyCreated(id=key.id, submitter=key.submitter, scopes=key.scopes.split(","), key=plaintext)
