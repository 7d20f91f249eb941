"""What a worker process needs, created in that process (never inherited across a fork)."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from app.core.db import make_engine, make_sessionmaker
from app.core.settings import Settings

if TYPE_CHECKING:
    from worker.sandbox.pool import SandboxPool

log = logging.getLogger(__name__)


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

    parent_warm_done: threading.Event | None = None
    parent_warm_s: dict[str, float] = field(default_factory=dict)

    def start_parent_warm(self, device: str) -> None:
        """Warm this process's side of the canary in the background (worker.canary.parent_warm), once; the next
        audit waits for it (`wait_parent_warm`) rather than pay the process's first training on its own clock."""
        if self.parent_warm_done is not None:
            return
        done = self.parent_warm_done = threading.Event()
        catalogue = self.catalogue

        def run() -> None:
            try:
                import torch

                from worker.canary.parent_warm import warm_parent

                self.parent_warm_s.update(warm_parent(torch.device(device), catalogue))
                log.info("canary warm-up on %s: %s", device, self.parent_warm_s)
            except Exception:  # noqa: BLE001 - a failed warm-up costs the first audit its time, nothing else
                log.warning(
                    "canary warm-up on %s failed; the first audit pays its first training", device, exc_info=True
                )
            finally:
                done.set()

        threading.Thread(target=run, name="canary-warm", daemon=True).start()

    def wait_parent_warm(self, timeout_s: float = 300.0) -> None:
        if self.parent_warm_done is not None:
            self.parent_warm_done.wait(timeout_s)

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
