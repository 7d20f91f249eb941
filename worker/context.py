"""What every stage gets: the problem, the solution, the device and a sandbox."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from worker.catalogue import Problem, Profile
from worker.formats import Solution
from worker.reference import Reference
from worker.sandbox import Sandbox
from worker.stages.result import StageResult

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


@dataclass
class AuditContext:
    problem: Problem
    solution: Solution
    device: str = "cpu"
    seed: int = field(default_factory=lambda: secrets.randbits(62))
    progress: Progress = _quiet
    results: dict[str, StageResult] = field(default_factory=dict)
    # exceptions that stop the whole audit (a Celery time limit) rather than fail one stage
    interrupts: tuple[type[BaseException], ...] = ()
    _sandbox: Sandbox | None = None

    @property
    def profile(self) -> Profile:
        return "gpu" if self.device.startswith("cuda") else "cpu"

    @cached_property
    def reference(self) -> Reference:
        return Reference.of(self.problem.definition)

    def sandbox(self) -> Sandbox:
        """The submission's child process, started (or restarted after a crash) with the solution loaded."""
        if self._sandbox is None:
            self._sandbox = Sandbox(self.device, interrupts=self.interrupts)
        self._sandbox.ensure(self.solution)
        return self._sandbox

    def derive_seed(self, *labels: object) -> int:
        """A fresh, reproducible seed per (audit, stage, round): the audit seed is the secret."""
        import hashlib

        h = hashlib.sha256(repr((self.seed, *labels)).encode()).digest()
        return int.from_bytes(h[:8], "big") >> 2

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None
