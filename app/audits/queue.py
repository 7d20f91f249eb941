"""Enqueue audits on the broker, always after the row is committed."""

from __future__ import annotations

import logging

from celery import Celery

log = logging.getLogger(__name__)

AUDIT_TASK = "kaudit.audit"


class AuditQueue:
    def __init__(self, celery: Celery) -> None:
        self.celery = celery

    def send(self, audit_id: str, queue: str) -> bool:
        """True if the broker took it. False is not fatal: the row is queued and the reaper re-sends it."""
        try:
            self.celery.send_task(AUDIT_TASK, args=[audit_id], queue=queue, retry=False)
            return True
        except Exception as err:  # noqa: BLE001 - broker down: the database row is the truth
            log.warning("could not enqueue audit %s (the reaper will): %s", audit_id, err)
            return False

    def pending(self, queue: str) -> int | None:
        """Messages waiting on the broker for this queue; None if the broker cannot say."""
        try:
            with self.celery.connection_for_write() as conn:
                return int(conn.default_channel.queue_declare(queue=queue, passive=True).message_count)
        except Exception as err:  # noqa: BLE001
            log.info("queue length unavailable for %s: %s", queue, err)
            return None
