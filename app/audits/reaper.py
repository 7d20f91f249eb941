"""The reaper: re-queues audits whose lease expired, and queued audits whose broker message was lost.

It runs as a thread in every Celery worker's parent process (only database and broker calls: no CUDA),
every `reaper_interval_s`, and once at worker start; `kaudit.reap` runs one pass on demand."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta

from celery import Celery
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.audits import events, repository
from app.audits.queue import AuditQueue
from app.audits.status import AuditStatus
from app.core.db import make_engine, make_sessionmaker, utcnow
from app.core.settings import Settings
from app.core.unit_of_work import UnitOfWork
from app.jobs.periodic import PeriodicThread, run_in_worker
from app.models import Audit

log = logging.getLogger(__name__)


@dataclass
class ReapReport:
    requeued_expired: list[str] = field(default_factory=list)
    gave_up: list[str] = field(default_factory=list)
    timed_out: list[str] = field(default_factory=list)
    resent_queued: list[str] = field(default_factory=list)


def reap_once(sessions: sessionmaker[Session], queue: AuditQueue, settings: Settings) -> ReapReport:
    report = ReapReport()
    with UnitOfWork(sessions, queue) as uow:
        requeued, report.gave_up, report.timed_out = repository.requeue_expired(
            uow.session, settings.max_claims, settings.hard_time_limit_s
        )
        for audit_id in (*report.gave_up, *report.timed_out):
            events.audit_completed(uow.session, audit_id)
        uow.enqueue(*requeued)  # sent once committed
        report.requeued_expired = [a.id for a in requeued]
    threshold = utcnow() - timedelta(seconds=settings.requeue_after_s)
    with sessions.begin() as s:
        queues = list(s.scalars(select(Audit.queue).where(Audit.status == AuditStatus.queued).distinct()))
        for q in queues:
            stale = repository.stale_queued(s, q, threshold)
            if not stale:
                continue
            pending = queue.pending(q)
            # the broker still holds at least one message per queued audit: nothing was lost
            if pending is not None and pending >= repository.count_queued(s, q):
                continue
            for a in stale:
                if queue.send(a.id, q):
                    report.resent_queued.append(a.id)
            repository.mark_enqueued(s, report.resent_queued)
    if report.requeued_expired or report.gave_up or report.timed_out or report.resent_queued:
        log.warning(
            "reaper: requeued expired %s, gave up on %s, timed out %s, re-sent queued %s",
            report.requeued_expired,
            report.gave_up,
            report.timed_out,
            report.resent_queued,
        )
    return report


def register(app: Celery, settings: Settings) -> None:
    queue = AuditQueue(app)
    run_in_worker(
        app,
        PeriodicThread(
            "kaudit-reaper", settings, settings.reaper_interval_s, lambda sessions: reap_once(sessions, queue, settings)
        ),
    )

    @app.task(name="kaudit.reap", ignore_result=True)
    def reap_task() -> dict[str, list[str]]:
        engine = make_engine(settings.model_copy(update={"db_pool_size": 1}))
        try:
            r = reap_once(make_sessionmaker(engine), AuditQueue(app), settings)
        finally:
            engine.dispose()
        return {"requeued_expired": r.requeued_expired, "gave_up": r.gave_up, "resent_queued": r.resent_queued}
