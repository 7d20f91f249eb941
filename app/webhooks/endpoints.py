"""Webhook endpoints of one API key: create (with a new signing secret), list, find, update, delete, delivery log."""

from __future__ import annotations

import base64
import secrets

from sqlalchemy import and_, delete, or_, select, update
from sqlalchemy.orm import Session

from app.core.db import utcnow
from app.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from app.webhooks import log_cursor
from app.webhooks.schemas import AttemptOut, AttemptPage, WebhookUpdate


def new_secret() -> str:
    """A Standard Webhooks secret: 'whsec_' and 32 random bytes in base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def create(session: Session, api_key_id: str, url: str, events: list[str]) -> WebhookEndpoint:
    endpoint = WebhookEndpoint(
        api_key_id=api_key_id,
        url=url,
        events=events,
        secret=new_secret(),
        active=True,
        consecutive_failures=0,
        created_at=utcnow(),
    )
    session.add(endpoint)
    session.flush()
    return endpoint


def owned(session: Session, api_key_id: str) -> list[WebhookEndpoint]:
    return list(
        session.scalars(
            select(WebhookEndpoint).where(WebhookEndpoint.api_key_id == api_key_id).order_by(WebhookEndpoint.created_at)
        )
    )


def find(session: Session, api_key_id: str, endpoint_id: str) -> WebhookEndpoint | None:
    """The endpoint, if this key owns it (another key's endpoint is as unknown as a missing one)."""
    endpoint = session.get(WebhookEndpoint, endpoint_id)
    return endpoint if endpoint is not None and endpoint.api_key_id == api_key_id else None


def apply(session: Session, endpoint: WebhookEndpoint, change: WebhookUpdate) -> None:
    if change.url is not None:
        endpoint.url = change.url
    if change.events is not None:
        endpoint.events = [e.value for e in change.events]
    if change.active is True and not endpoint.active:
        endpoint.active, endpoint.consecutive_failures = True, 0
        endpoint.disabled_at = endpoint.disabled_reason = None
        # what waited while it was disabled is due now
        session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.endpoint_id == endpoint.id, WebhookDelivery.status == "pending")
            .values(next_attempt_at=utcnow())
        )
    elif change.active is False and endpoint.active:
        endpoint.active, endpoint.disabled_at, endpoint.disabled_reason = False, utcnow(), "disabled by its owner"
    session.flush()


def remove(session: Session, endpoint: WebhookEndpoint) -> None:
    session.execute(delete(WebhookAttempt).where(WebhookAttempt.endpoint_id == endpoint.id))
    session.execute(delete(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint.id))
    session.delete(endpoint)
    session.flush()


def attempts(session: Session, endpoint_id: str, limit: int, cursor: str | None = None) -> AttemptPage:
    """The delivery log, newest attempt first, one page. Raises BadCursor."""
    stmt = (
        select(WebhookAttempt, WebhookDelivery)
        .join(WebhookDelivery, WebhookDelivery.id == WebhookAttempt.delivery_id)
        .where(WebhookAttempt.endpoint_id == endpoint_id)
    )
    if cursor is not None:
        at, row_id = log_cursor.decode(cursor)
        stmt = stmt.where(
            or_(WebhookAttempt.started_at < at, and_(WebhookAttempt.started_at == at, WebhookAttempt.id < row_id))
        )
    rows = session.execute(
        stmt.order_by(WebhookAttempt.started_at.desc(), WebhookAttempt.id.desc()).limit(limit + 1)
    ).all()
    items = [
        AttemptOut(
            delivery_id=d.id,
            event_id=d.event_id,
            event=d.event,
            attempt=a.attempt,
            started_at=a.started_at,
            status_code=a.status_code,
            latency_ms=a.latency_ms,
            error=a.error,
            outcome=a.outcome,
            retry_at=a.retry_at,
            delivery_status=d.status,
        )
        for a, d in rows[:limit]
    ]
    last = rows[limit - 1][0] if len(rows) > limit else None
    return AttemptPage(items=items, next_cursor=None if last is None else log_cursor.encode(last.started_at, last.id))
