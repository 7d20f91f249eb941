"""A pass that runs every few seconds in a Celery worker's parent process, from worker start to shutdown (database and
broker calls only: no CUDA there). The reaper and the webhook sweep are two such passes."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from celery import Celery, signals
from sqlalchemy.orm import Session, sessionmaker

from app.core.db import make_engine, make_sessionmaker
from app.core.settings import Settings

log = logging.getLogger(__name__)


class PeriodicThread:
    """Runs `work(sessions)` at start and then every `interval_s`, on its own one-connection engine."""

    def __init__(
        self, name: str, settings: Settings, interval_s: float, work: Callable[[sessionmaker[Session]], object]
    ) -> None:
        self.name, self._settings, self._interval_s, self._work = name, settings, interval_s, work
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        engine = make_engine(self._settings.model_copy(update={"db_pool_size": 1}))
        sessions = make_sessionmaker(engine)

        def loop() -> None:
            while True:
                try:
                    self._work(sessions)
                except Exception as err:  # noqa: BLE001 - database or broker briefly away: try again next round
                    log.warning("%s pass failed: %s", self.name, err)
                if self._stop.wait(self._interval_s):
                    break
            engine.dispose()

        self._thread = threading.Thread(target=loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def run_in_worker(app: Celery, thread: PeriodicThread) -> None:
    """Start `thread` when this app's worker is ready; stop it when the worker shuts down."""

    @signals.worker_ready.connect(weak=False)
    def _start(sender=None, **_kw) -> None:  # type: ignore[no-untyped-def]
        if sender is not None and getattr(sender, "app", app) is app:
            thread.start()

    @signals.worker_shutdown.connect(weak=False)
    def _stop(sender=None, **_kw) -> None:  # type: ignore[no-untyped-def]
        thread.stop()
