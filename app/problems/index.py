"""Address -> content hash of the known problems, cached per process, for the public reads that name a problem in
their path (leaderboards, the dashboard's pages): these see public problems only."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.models import Problem


@dataclass(frozen=True)
class _Entry:
    content_hash: str
    public: bool
    live: bool


class ProblemIndex:
    """Re-read at most every `ttl_s`; a change in this process (upload, publish, delete, sync) invalidates it at once,
    other API processes see it within `ttl_s`. Who may use a private problem is decided from the database
    (app.problems.access), never from here."""

    def __init__(self, ttl_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl, self._clock = ttl_s, clock
        self._entries: dict[str, _Entry] = {}
        self._at = float("-inf")

    def _load(self, session: Session) -> dict[str, _Entry]:
        if self._clock() - self._at > self._ttl:
            rows = session.execute(select(Problem.name, Problem.content_hash, Problem.public, Problem.deleted_at))
            self._entries = {name: _Entry(h, bool(public), deleted is None) for name, h, public, deleted in rows}
            self._at = self._clock()
        return self._entries

    def get(self, session: Session) -> dict[str, str]:
        """The public problems (catalogue and published uploads) that are not deleted."""
        return {name: e.content_hash for name, e in self._load(session).items() if e.public and e.live}

    def every(self, session: Session) -> dict[str, str]:
        """Every problem not deleted, private uploads included (for admin work such as re-audits)."""
        return {name: e.content_hash for name, e in self._load(session).items() if e.live}

    def invalidate(self) -> None:
        self._at = float("-inf")
