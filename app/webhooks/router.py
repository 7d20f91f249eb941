"""/v1/webhooks: an API key's webhook endpoints (create, list, read, update or re-enable, delete) and delivery log."""

from __future__ import annotations

import re
from typing import Annotated

import httpx
from fastapi import APIRouter, HTTPException, Query, Response

from app.api.deps import SessionDep, SettingsDep
from app.auth.dependencies import PrincipalDep
from app.core.errors import ApiError, ErrorBody, FieldError
from app.core.settings import Settings
from app.models import WebhookEndpoint
from app.webhooks import endpoints
from app.webhooks.log_cursor import BadCursor
from app.webhooks.schemas import (
    AttemptPage,
    WebhookCreate,
    WebhookCreated,
    WebhookOut,
    WebhookUpdate,
)
from app.webhooks.ssrf import AddressPolicy, RefusedAddress

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])
_ID = re.compile(r"[0-9a-f]{32}")
NOT_FOUND = {404: {"description": "no such endpoint for this API key"}}


def _reachable(url: str, settings: Settings) -> None:
    """Refuse, at registration, a URL whose host resolves to an address the sender would refuse at connect time."""
    target = httpx.URL(url)
    try:
        AddressPolicy.parse(settings.webhook_allowlist).resolve(
            target.host, target.port or (443 if target.scheme == "https" else 80)
        )
    except RefusedAddress as err:
        raise ApiError(422, "webhook URL not allowed", [FieldError(field="url", reason=str(err))]) from err


def _out(e: WebhookEndpoint) -> WebhookOut:
    return WebhookOut(
        id=e.id,
        url=e.url,
        events=list(e.events),
        active=e.active,
        consecutive_failures=e.consecutive_failures,
        disabled_at=e.disabled_at,
        disabled_reason=e.disabled_reason,
        created_at=e.created_at,
    )


def _owned(session: SessionDep, principal: PrincipalDep, endpoint_id: str) -> WebhookEndpoint:
    endpoint = endpoints.find(session, principal.key_id, endpoint_id) if _ID.fullmatch(endpoint_id) else None
    if endpoint is None:
        raise HTTPException(404, "no such webhook endpoint")
    return endpoint


@router.post(
    "", status_code=201, response_model=WebhookCreated, responses={422: {"description": "invalid or unreachable URL"}}
)
def create(body: WebhookCreate, principal: PrincipalDep, session: SessionDep, settings: SettingsDep) -> WebhookCreated:
    """Register an endpoint for this API key's events (admin keys: every submission's). The secret is shown once."""
    _reachable(body.url, settings)
    e = endpoints.create(session, principal.key_id, body.url, [ev.value for ev in body.events])
    return WebhookCreated(**_out(e).model_dump(), secret=e.secret)


@router.get("", response_model=list[WebhookOut])
def list_endpoints(principal: PrincipalDep, session: SessionDep) -> list[WebhookOut]:
    return [_out(e) for e in endpoints.owned(session, principal.key_id)]


@router.get("/{endpoint_id}", response_model=WebhookOut, responses=NOT_FOUND)
def read(endpoint_id: str, principal: PrincipalDep, session: SessionDep) -> WebhookOut:
    return _out(_owned(session, principal, endpoint_id))


@router.patch("/{endpoint_id}", response_model=WebhookOut, responses=NOT_FOUND)
def change(
    endpoint_id: str, body: WebhookUpdate, principal: PrincipalDep, session: SessionDep, settings: SettingsDep
) -> WebhookOut:
    """Change the URL or events; `{"active": true}` re-enables a disabled endpoint and sends what waited."""
    endpoint = _owned(session, principal, endpoint_id)
    if body.url is not None:
        _reachable(body.url, settings)
    endpoints.apply(session, endpoint, body)
    return _out(endpoint)


@router.delete("/{endpoint_id}", status_code=204, responses=NOT_FOUND)
def remove(endpoint_id: str, principal: PrincipalDep, session: SessionDep) -> Response:
    endpoints.remove(session, _owned(session, principal, endpoint_id))
    return Response(status_code=204)


@router.get(
    "/{endpoint_id}/deliveries",
    response_model=AttemptPage,
    responses={**NOT_FOUND, 422: {"model": ErrorBody, "description": "bad limit or cursor"}},
)
def deliveries(
    endpoint_id: str,
    principal: PrincipalDep,
    session: SessionDep,
    cursor: Annotated[str | None, Query(max_length=200, description="next_cursor from the previous page")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> AttemptPage:
    """The delivery log, newest attempt first, a page at a time (like GET /v1/submissions): event, attempt number,
    status code, latency, error, the attempt's own outcome and, after a failure, when the backoff retries it."""
    endpoint = _owned(session, principal, endpoint_id)
    try:
        return endpoints.attempts(session, endpoint.id, limit, cursor)
    except BadCursor as err:
        raise ApiError(422, "invalid cursor", [FieldError(field="cursor", reason=str(err))]) from err
