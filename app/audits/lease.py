"""A heartbeat thread that keeps an audit's lease alive while its stages run."""

from __future__ import annotations

import logging
import threading

from sqlalchemy.orm import Session, sessionmaker

from app.audits import repository

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(
        self, sessions: sessionmaker[Session], audit_id: str, owner: str, lease_s: float, every_s: float
    ) -> None:
        self._sessions, self._audit_id, self._owner = sessions, audit_id, owner
        self._lease_s, self._every_s = lease_s, every_s
        self._stop = threading.Event()
        self.lost = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{audit_id}", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                with self._sessions.begin() as s:
                    if not repository.heartbeat(s, self._audit_id, self._owner, self._lease_s):
                        self.lost.set()
                        return
            except Exception as err:  # noqa: BLE001 - a missed beat is survivable; the lease is longer than a beat
                log.warning("heartbeat for %s failed: %s", self._audit_id, err)

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
