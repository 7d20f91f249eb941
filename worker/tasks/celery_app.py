"""`celery -A worker.tasks.celery_app worker -Q cpu --concurrency 1`: the worker entry point."""

from __future__ import annotations

from app.core.settings import Settings
from worker.tasks.factory import make_celery

app = make_celery(Settings(), register_tasks=True)
