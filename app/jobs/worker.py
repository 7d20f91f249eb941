"""`celery -A app.jobs.worker worker -Q cpu --concurrency 1`: the worker entry point."""

from __future__ import annotations

from app.core.settings import Settings
from app.jobs.celery import make_celery

app = make_celery(Settings(), register_tasks=True)
