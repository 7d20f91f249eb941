"""Attempt one outbox row: claim it with its dispatch token, POST it signed, log the attempt, then mark it delivered,
schedule the next attempt (exponential backoff with jitter), or give up; count the endpoint's consecutive failures
and disable it at the threshold. No transaction is held open during the HTTP request."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from app.core.db import utcnow
from app.core.jsonsafe import storable_text
from app.core.settings import Settings
from app.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from app.webhooks import sender
from app.webhooks.backoff import retry_delay_s
from app.webhooks.ssrf import AddressPolicy, Resolver, system_resolver


def lease_s(settings: Settings) -> float:
    """How long a dispatched delivery waits for its task before the sweep sends it again."""
    return 120.0 + 4 * settings.webhook_timeout_s


@dataclass(frozen=True)
class _Claimed:
    endpoint_id: str
    url: str
    secret: str
    event_id: str
    body: str
    attempt: int


def _claim(session: Session, delivery_id: str, token: str, settings: Settings) -> _Claimed | None:
    now = utcnow()
    active = select(WebhookEndpoint.id).where(WebhookEndpoint.active.is_(True))
    res = session.execute(
        update(WebhookDelivery)
        .where(
            WebhookDelivery.id == delivery_id,
            WebhookDelivery.dispatch_token == token,
            WebhookDelivery.status == "pending",
            WebhookDelivery.endpoint_id.in_(active),
        )
        .values(
            dispatch_token=None,
            attempts=WebhookDelivery.attempts + 1,
            locked_until=now + timedelta(seconds=lease_s(settings)),
        )
    )
    if res.rowcount != 1:
        return None
    d, e = session.execute(
        select(WebhookDelivery, WebhookEndpoint)
        .join(WebhookEndpoint, WebhookEndpoint.id == WebhookDelivery.endpoint_id)
        .where(WebhookDelivery.id == delivery_id)
        .execution_options(populate_existing=True)
    ).one()
    body = json.dumps(d.payload, separators=(",", ":"), sort_keys=True)
    return _Claimed(e.id, e.url, e.secret, d.event_id, body, d.attempts)


def _record(
    session: Session, delivery_id: str, c: _Claimed, result: sender.AttemptResult, settings: Settings, started: datetime
) -> str:
    now = utcnow()
    if session.get(WebhookDelivery, delivery_id, with_for_update=True) is None:
        return "deleted"  # its endpoint was deleted while the request was in flight
    error = None if result.error is None else storable_text(result.error[:2000])
    # the attempt's own outcome, in the log for good: a later success of its delivery does not make it delivered
    logged = WebhookAttempt(
        delivery_id=delivery_id,
        endpoint_id=c.endpoint_id,
        attempt=c.attempt,
        started_at=started,
        status_code=result.status_code,
        latency_ms=result.latency_ms,
        error=error,
        outcome="delivered" if result.ok else "failed",
        retry_at=None,
    )
    session.add(logged)
    common = dict(locked_until=None, last_response_code=result.status_code, last_error=error)
    if result.ok:
        session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id == delivery_id)
            .values(status="delivered", delivered_at=now, **common)
        )
        session.execute(
            update(WebhookEndpoint).where(WebhookEndpoint.id == c.endpoint_id).values(consecutive_failures=0)
        )
        return "delivered"
    if c.attempt >= settings.webhook_max_attempts:
        outcome, values = "failed", dict(status="failed")
    else:
        delay = retry_delay_s(
            c.attempt, settings.webhook_backoff_base_s, settings.webhook_backoff_max_s, random.Random()
        )
        logged.retry_at = now + timedelta(seconds=delay)
        outcome, values = "retry", dict(next_attempt_at=logged.retry_at)
    session.execute(update(WebhookDelivery).where(WebhookDelivery.id == delivery_id).values(**values, **common))
    session.execute(
        update(WebhookEndpoint)
        .where(WebhookEndpoint.id == c.endpoint_id)
        .values(consecutive_failures=WebhookEndpoint.consecutive_failures + 1)
    )
    endpoint = session.get(WebhookEndpoint, c.endpoint_id, populate_existing=True)
    if endpoint is not None and endpoint.active and endpoint.consecutive_failures >= settings.webhook_disable_after:
        endpoint.active = False
        endpoint.disabled_at = now
        endpoint.disabled_reason = (
            f"disabled after {endpoint.consecutive_failures} consecutive failed attempts; last: {error}"[:500]
        )
        logged.retry_at = None  # nothing is retried while the endpoint is disabled (re-enabling sends it at once)
        outcome += "+disabled"
    return outcome


def attempt(
    sessions: sessionmaker[Session],
    settings: Settings,
    delivery_id: str,
    token: str,
    *,
    policy: AddressPolicy,
    resolver: Resolver = system_resolver,
) -> str:
    """Returns 'noop' (not ours: already attempted, delivered, or the endpoint is disabled), 'delivered', 'retry',
    'failed' (out of attempts), with '+disabled' when this failure disabled the endpoint, or 'deleted'."""
    with sessions.begin() as s:
        claimed = _claim(s, delivery_id, token, settings)
    if claimed is None:
        return "noop"
    started = utcnow()
    headers = sender.signed_headers(claimed.secret, claimed.event_id, claimed.body)
    try:
        result = sender.post(
            claimed.url, claimed.body, headers, policy=policy, timeout_s=settings.webhook_timeout_s, resolver=resolver
        )
    except SoftTimeLimitExceeded:  # a response trickled in slower than the task may run
        result = sender.AttemptResult(
            None, (utcnow() - started).total_seconds() * 1000, "timeout: the task's time limit"
        )
    with sessions.begin() as s:
        return _record(s, delivery_id, claimed, result, settings, started)
