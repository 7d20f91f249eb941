"""One time budget per audit (no torch here: the service's settings build these).

How the audit tells the kernel's faults from the auditor's own limits is in worker.watched_sandbox:

Every request to the submission's process goes through a `WatchedSandbox`, whose timeouts are capped
by what is left of the audit's budget. A kernel call ("load", "call", "time") that runs past the full
per-call timeout is a hang, the kernel's fault: the audit stops at once and ends `timed_out`. A stage
whose kernel calls all raised is a crash on every call: later stages would only repeat it, so they are
skipped and say why. A request cut short only because the audit's budget ran out, or the auditor's own
work running long (the canary's training), is inconclusive: an `error`, never a `fail`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, Field


class AuditBudget(BaseModel):
    total_s: float = Field(gt=0, description="wall-clock seconds for the whole audit, every stage included")
    call_timeout_s: float = Field(
        gt=0, description="one kernel call (import, call or timing request) longer than this is a hang"
    )


# CPU: the Triton interpreter costs ~0.5 ms per program instance, so calls are slow but bounded
CPU_BUDGET = AuditBudget(total_s=900.0, call_timeout_s=120.0)
GPU_BUDGET = AuditBudget(total_s=300.0, call_timeout_s=60.0)


def budget_for(device: str) -> AuditBudget:
    return GPU_BUDGET if device.startswith("cuda") else CPU_BUDGET


class KernelFault(BaseModel):
    stage: str
    kind: Literal["hang", "crash"]
    message: str


class Deadline:
    def __init__(self, budget: AuditBudget, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget, self._clock = budget, clock
        self._end = clock() + budget.total_s

    def remaining_s(self) -> float:
        return max(0.0, self._end - self._clock())

    @property
    def expired(self) -> bool:
        return self.remaining_s() <= 0.0
