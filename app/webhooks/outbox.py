"""Outbox rows: one per (event, endpoint), written in the caller's transaction, so an event exists exactly when the
change that caused it commits. The event id is derived from what happened (not drawn at random): the same change
reported twice (a task delivered twice, a resumed audit) maps to the same id and the unique (event_id, endpoint_id)
keeps one row."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

from pydantic import BaseModel
from sqlalchemy import or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from app.core.db import utcnow
from app.models import ApiKey, WebhookDelivery, WebhookEndpoint, new_id
from app.webhooks.event_types import Envelope, EventType


def event_id(event: EventType, key: str) -> str:
    return "evt_" + hashlib.sha256(f"{event.value}:{key}".encode()).hexdigest()[:40]


def recipients(session: Session, event: EventType, owner_key_id: str) -> list[WebhookEndpoint]:
    """Active endpoints subscribed to `event` of the submission's own API key and of admin keys."""
    rows = session.scalars(
        select(WebhookEndpoint)
        .join(ApiKey, ApiKey.id == WebhookEndpoint.api_key_id)
        .where(
            WebhookEndpoint.active.is_(True),
            ApiKey.revoked_at.is_(None),
            or_(WebhookEndpoint.api_key_id == owner_key_id, ApiKey.scopes.contains("admin")),
        )
    )
    return [e for e in rows if event.value in e.events]


def emit(
    session: Session, event: EventType, key: str, data: BaseModel, *, owner_key_id: str, audit_id: str | None
) -> int:
    """Write one outbox row per recipient endpoint (none twice); returns how many recipients there are."""
    endpoints = recipients(session, event, owner_key_id)
    if not endpoints:
        return 0
    eid = event_id(event, key)
    envelope = Envelope(
        type=event, timestamp=datetime.now(UTC).isoformat(timespec="milliseconds"), data=data.model_dump(mode="json")
    ).model_dump(mode="json")
    now = utcnow()
    insert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    for endpoint in endpoints:
        session.execute(
            insert(WebhookDelivery)
            .values(
                id=new_id(),
                endpoint_id=endpoint.id,
                event_id=eid,
                audit_id=audit_id,
                event=event.value,
                payload=envelope,
                status="pending",
                attempts=0,
                next_attempt_at=now,
                created_at=now,
            )
            .on_conflict_do_nothing(index_elements=["event_id", "endpoint_id"])
        )
    return len(endpoints)
