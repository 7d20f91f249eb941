"""Sending due outbox rows to the webhooks queue, and the Celery task that attempts each one.

A sweep (a thread in each worker's parent process, every `webhook_sweep_interval_s`) takes due rows of active
endpoints, gives each a fresh dispatch token and a lease, and sends `kaudit.webhook` with (row, token) to
`<prefix>webhooks`. The task attempts the row only if the token is still the row's: a message delivered twice,
or one the sweep replaced after its lease ran out, does nothing. A lost message is re-sent when the lease ends."""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

from celery import Celery
from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from app.core.db import utcnow
from app.core.settings import Settings
from app.jobs.periodic import PeriodicThread, run_in_worker
from app.jobs.resources import ProcessLocal
from app.models import WebhookDelivery, WebhookEndpoint
from app.webhooks import delivery
from app.webhooks.ssrf import AddressPolicy

log = logging.getLogger(__name__)

WEBHOOK_TASK = "kaudit.webhook"


def dispatch_due(sessions: sessionmaker[Session], celery: Celery, settings: Settings, limit: int = 200) -> list[str]:
    """Send every due delivery of an active endpoint (up to `limit`) to the webhooks queue; returns their ids."""
    now = utcnow()
    free = or_(WebhookDelivery.locked_until.is_(None), WebhookDelivery.locked_until < now)
    claimed: list[tuple[str, str]] = []
    with sessions.begin() as s:
        due = s.scalars(
            select(WebhookDelivery.id)
            .join(WebhookEndpoint, WebhookEndpoint.id == WebhookDelivery.endpoint_id)
            .where(
                WebhookDelivery.status == "pending",
                WebhookDelivery.next_attempt_at <= now,
                free,
                WebhookEndpoint.active.is_(True),
            )
            .order_by(WebhookDelivery.next_attempt_at)
            .limit(limit)
        ).all()
        for delivery_id in due:
            token = uuid.uuid4().hex
            res = s.execute(
                update(WebhookDelivery)
                .where(WebhookDelivery.id == delivery_id, free)
                .values(dispatch_token=token, locked_until=now + timedelta(seconds=delivery.lease_s(settings)))
            )
            if res.rowcount == 1:
                claimed.append((delivery_id, token))
    sent = []
    for delivery_id, token in claimed:
        try:
            celery.send_task(WEBHOOK_TASK, args=[delivery_id, token], queue=settings.webhook_queue, retry=False)
            sent.append(delivery_id)
        except Exception as err:  # noqa: BLE001 - broker away: the lease runs out and the next sweep sends it
            log.warning("could not send webhook delivery %s (re-sent after its lease): %s", delivery_id, err)
    return sent


def register(app: Celery, settings: Settings) -> None:
    """The delivery task, and the sweep in the worker's parent process."""
    policy = AddressPolicy.parse(settings.webhook_allowlist)
    local = ProcessLocal(settings)
    run_in_worker(
        app,
        PeriodicThread(
            "kaudit-webhook-sweep",
            settings,
            settings.webhook_sweep_interval_s,
            lambda sessions: dispatch_due(sessions, app, settings),
        ),
    )

    limit = int(3 * settings.webhook_timeout_s) + 10

    @app.task(
        name=WEBHOOK_TASK,
        acks_late=True,
        reject_on_worker_lost=True,
        ignore_result=True,
        soft_time_limit=limit,
        time_limit=limit + 10,
    )
    def webhook_task(delivery_id: str, token: str) -> str:
        outcome = delivery.attempt(local.get().sessions, settings, delivery_id, token, policy=policy)
        log.info("webhook delivery %s: %s", delivery_id, outcome)
        return outcome
