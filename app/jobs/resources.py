"""What a worker process needs, created in that process (never inherited across a fork)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from app.core.db import make_engine, make_sessionmaker
from app.core.settings import Settings

if TYPE_CHECKING:
    from worker.sandbox.pool import SandboxPool


@dataclass
class WorkerResources:
    settings: Settings
    pid: int = field(default_factory=os.getpid)

    @cached_property
    def engine(self) -> Engine:
        return make_engine(self.settings.model_copy(update={"db_pool_size": 2}))

    @cached_property
    def sessions(self) -> sessionmaker[Session]:
        return make_sessionmaker(self.engine)

    pools: dict[str, "SandboxPool"] = field(default_factory=dict)

    def sandbox_pool(self, device: str) -> "SandboxPool | None":
        """This process's spare sandbox children for `device` (KAUDIT_SANDBOX_SPARE), started on first use."""
        if not self.settings.sandbox_spare:
            return None
        if device not in self.pools:
            from worker.sandbox.pool import SandboxPool

            self.pools[device] = SandboxPool(device, self.settings.isolation)
        return self.pools[device]

    @cached_property
    def catalogue(self):  # type: ignore[no-untyped-def]
        from worker.catalogue import DEFAULT_ROOT, load_catalogue

        return load_catalogue(self.settings.catalogue_root or DEFAULT_ROOT)


class ProcessLocal:
    """Resources for the current process; a forked child builds its own instead of reusing its parent's."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._res: WorkerResources | None = None

    def get(self) -> WorkerResources:
        if self._res is None or self._res.pid != os.getpid():
            if self._res is not None and "engine" in self._res.__dict__:
                self._res.engine.dispose(close=False)  # the parent's connections are not ours to use or close
            self._res = WorkerResources(self._settings)
        return self._res
