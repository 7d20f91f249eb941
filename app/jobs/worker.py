"""`celery -A app.jobs.worker worker -Q cpu --concurrency 1`: the worker entry point.

Audits go to `cpu`/`gpu`, webhook deliveries to `webhooks` (with KAUDIT_QUEUE_PREFIX): some worker must consume
it, e.g. `-Q webhooks --concurrency 4` (docker-compose's worker-webhooks) or `-Q cpu,webhooks` (`kaudit serve`)."""

from __future__ import annotations

from app.core.settings import Settings
from app.jobs.celery import make_celery

app = make_celery(Settings(), register_tasks=True)
