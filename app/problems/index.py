"""Name -> content hash of the known problems, cached per process."""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.models import Problem


class ProblemIndex:
    """Name -> content hash of known problems, re-read at most every `ttl_s` (POST checks it on every call)."""

    def __init__(self, ttl_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl, self._clock = ttl_s, clock
        self._names: dict[str, str] = {}
        self._at = float("-inf")

    def get(self, session: Session) -> dict[str, str]:
        if self._clock() - self._at > self._ttl:
            self._names = {name: h for name, h in session.execute(select(Problem.name, Problem.content_hash))}
            self._at = self._clock()
        return self._names

    def invalidate(self) -> None:
        self._at = float("-inf")
