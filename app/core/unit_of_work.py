"""One transaction, then the broker: audits are sent only after the rows that describe them are committed.

Used by each API request (through `app.api.deps.UnitOfWorkDep`) and by the operator commands, so
"commit, then enqueue" is written once."""

from __future__ import annotations

from types import TracebackType

from sqlalchemy.orm import Session, sessionmaker

from app.audits.queue import AuditQueue
from app.models import Audit


class UnitOfWork:
    def __init__(self, sessions: sessionmaker[Session], queue: AuditQueue | None) -> None:
        self._sessions, self._queue = sessions, queue
        self._to_send: list[tuple[str, str]] = []
        self.session: Session = sessions()

    def enqueue(self, *audits: Audit) -> None:
        """Send these audits to their queues once the transaction commits (never before, never if it rolls back)."""
        self._to_send.extend((a.id, a.queue) for a in audits)

    def commit(self) -> None:
        self.session.commit()
        pending, self._to_send = self._to_send, []
        if self._queue is not None:
            for audit_id, queue in pending:
                self._queue.send(audit_id, queue)  # a lost send is re-sent by the reaper: the row is the truth

    def __enter__(self) -> UnitOfWork:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if exc_type is None:
                self.commit()
            else:
                self.session.rollback()
        finally:
            self.session.close()
