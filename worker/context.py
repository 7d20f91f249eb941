"""What every stage gets: the problem, the solution, the device and a sandbox."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from worker.budget import AuditBudget, Deadline, budget_for
from worker.catalogue import Problem, Profile
from worker.formats import Solution
from worker.reference import Reference
from worker.sandbox import Isolation, Sandbox
from worker.sandbox.pool import SandboxPool
from worker.sandboxed_reference import SandboxedReference
from worker.stages.result import StageResult
from worker.watched_sandbox import WatchedSandbox

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
    budget: AuditBudget | None = None
    # "namespaces" (bubblewrap) or "none"; None: namespaces where this host allows them (worker.sandbox.default_isolation)
    isolation: Isolation | None = None
    # the benchmark's random inputs made by the child from recipes (worker.generated) instead of shipped to it;
    # None: on a GPU only (on the CPU the parent's clock times each call's round trip, making included)
    inputs_made_in_child: bool | None = None
    # a worker process's spare children (worker.sandbox.pool): this audit takes one instead of starting its own
    pool: SandboxPool | None = None
    # how the submission's process was bounded in memory (worker.sandbox.memory), for the report
    memory_note: str = "not started"
    # a C++ solution's built extension (worker.compile_step.LoadableArtifact), set by intake's compile step
    artifact: Any = None
    _sandbox: Sandbox | None = None
    _watched: WatchedSandbox | None = None
    _stage: str = ""

    @cached_property
    def deadline(self) -> Deadline:
        """Starts on first use (the engine touches it before the first stage)."""
        return Deadline(self.budget or budget_for(self.device))

    @property
    def watch(self) -> WatchedSandbox | None:
        """The tally of the current stage's kernel calls; None until a stage asks for the sandbox."""
        return self._watched

    @property
    def makes_inputs_in_child(self) -> bool:
        return self.inputs_made_in_child if self.inputs_made_in_child is not None else self.device.startswith("cuda")

    @property
    def profile(self) -> Profile:
        return "gpu" if self.device.startswith("cuda") else "cpu"

    @cached_property
    def reference(self) -> Reference | SandboxedReference:
        """The curated reference runs here; an uploaded one is the uploader's code and runs in a sandbox of its own."""
        if self.problem.reference_trusted:
            return Reference.of(self.problem.definition)
        return SandboxedReference(
            self.problem.definition,
            self.device,
            timeout_s=self.deadline.budget.call_timeout_s,
            interrupts=self.interrupts,
            isolation=self.isolation,
        )

    def sandbox(self) -> WatchedSandbox:
        """The submission's child process, started (or restarted after a crash) with the solution loaded;
        every request is bounded by the audit's remaining budget."""
        if self._sandbox is None:
            if self.pool is not None and self.pool.device == self.device and self.pool.isolation == self.isolation:
                self._sandbox = self.pool.take()
                self._sandbox.interrupts = self.interrupts
                self._sandbox.default_timeout_s = self.deadline.budget.call_timeout_s
            else:
                self._sandbox = Sandbox(
                    self.device,
                    interrupts=self.interrupts,
                    isolation=self.isolation,
                    default_timeout_s=self.deadline.budget.call_timeout_s,
                )
            self.isolation = self._sandbox.isolation
        self._sandbox.artifact = self.artifact
        if self._watched is None:
            self._watched = WatchedSandbox(self._sandbox, self.deadline)
            self._watched.begin_stage(self._stage)
        self._watched.ensure(self.solution)
        return self._watched

    def begin_stage(self, name: str) -> None:
        self._stage = name
        if self._watched is not None:
            self._watched.begin_stage(name)

    def derive_seed(self, *labels: object) -> int:
        """A fresh, reproducible seed per (audit, stage, round): the audit seed is the secret."""
        import hashlib

        h = hashlib.sha256(repr((self.seed, *labels)).encode()).digest()
        return int.from_bytes(h[:8], "big") >> 2

    def end_processes(self) -> None:
        """Ends the submission's process and an uploaded reference's; each starts again when a stage next asks for it.

        A stage that ran out of device memory runs again only after this: a child's caching allocator keeps what the
        failed attempt reserved, and no one else can free it. On an 80 GB H100 the retries of a canary at width 4096
        waited for memory that a process of the same audit held (49-60 GiB through all three attempts,
        benchmarks/results/h100-2026-12-08). Ending the process is the one release a hostile child cannot refuse."""
        reference = self.__dict__.pop("reference", None)
        if isinstance(reference, SandboxedReference):
            reference.close()
        if self._sandbox is not None:
            self.memory_note = self._sandbox.memory_note
            self._sandbox.close()
            self._sandbox = None
            self._watched = None

    def close(self) -> None:
        self.end_processes()
