"""The webhooks API's bodies and responses."""

from __future__ import annotations

from datetime import datetime

import httpx
from pydantic import BaseModel, Field, field_validator

from app.webhooks.event_types import EventType

ALL_EVENTS = list(EventType)


def _check_url(v: str) -> str:
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in v):
        raise ValueError("no spaces or control characters")
    try:
        url = httpx.URL(v)
    except (httpx.InvalidURL, ValueError) as err:
        raise ValueError(f"not a URL: {err}") from err
    if url.scheme not in ("http", "https"):
        raise ValueError("the scheme must be http or https")
    if not url.host:
        raise ValueError("the URL needs a host")
    if url.userinfo:
        raise ValueError("credentials in the URL are not allowed (authenticate the sender by its signature)")
    return v


class WebhookCreate(BaseModel):
    url: str = Field(
        max_length=2000, description="http(s) URL; must resolve to a public address (or one the operator allows)"
    )
    events: list[EventType] = Field(
        default_factory=lambda: list(ALL_EVENTS), min_length=1, description="default: every event"
    )

    _url = field_validator("url")(_check_url)

    @field_validator("events")
    @classmethod
    def _unique(cls, v: list[EventType]) -> list[EventType]:
        return list(dict.fromkeys(v))


class WebhookUpdate(BaseModel):
    url: str | None = Field(default=None, max_length=2000)
    events: list[EventType] | None = Field(default=None, min_length=1)
    active: bool | None = Field(
        default=None, description="true re-enables a disabled endpoint (and resets its failure count)"
    )

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return None if v is None else _check_url(v)

    @field_validator("events")
    @classmethod
    def _unique(cls, v: list[EventType] | None) -> list[EventType] | None:
        return None if v is None else list(dict.fromkeys(v))


class WebhookOut(BaseModel):
    id: str
    url: str
    events: list[str]
    active: bool
    consecutive_failures: int
    disabled_at: datetime | None
    disabled_reason: str | None
    created_at: datetime


class WebhookCreated(WebhookOut):
    secret: str = Field(description="shown once: verify each delivery's webhook-signature with it (Standard Webhooks)")


class AttemptOut(BaseModel):
    delivery_id: str
    event_id: str = Field(description="the webhook-id header")
    event: str
    attempt: int
    started_at: datetime
    status_code: int | None
    latency_ms: float
    error: str | None
    outcome: str = Field(
        description="this attempt's own result: delivered (answered 2xx) or failed (any other answer, "
        "a timeout, a refused address or a connection error)"
    )
    retry_at: datetime | None = Field(
        description="failed: when the backoff scheduled the next attempt; null when none "
        "was (delivered, out of attempts, or the endpoint was disabled)"
    )
    delivery_status: str = Field(
        description="the delivery's status now (pending | delivered | failed), across all its "
        "attempts: see `outcome` for this attempt's"
    )


class AttemptPage(BaseModel):
    items: list[AttemptOut] = Field(description="newest attempt first")
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null on the last page")
