"""Requests to the submission's process, bounded by the audit's budget, with its faults tallied per stage.

Every request goes through a `WatchedSandbox`, whose timeouts are capped by what is left of the audit's
budget. A kernel call ("load", "call", "time") that runs past the full per-call timeout is a hang, the
kernel's fault: the audit stops at once and ends `timed_out`. A stage whose kernel calls all raised is a
crash on every call: later stages would only repeat it, so they are skipped and say why. A request cut
short only because the audit's budget ran out, or the auditor's own work running long (the canary's
training), is inconclusive: an `error`, never a `fail`.
"""

from __future__ import annotations

from typing import Any, TypeVar

from worker.budget import Deadline, KernelFault
from worker.formats import Solution
from worker.sandbox import (
    Sandbox,
    SandboxCrash,
    SandboxError,
    SandboxTimeout,
    SubmissionError,
)
from worker.sandbox.protocol import Reply, Request, request_for

ReplyT = TypeVar("ReplyT", bound=Reply)

KERNEL_OPS = frozenset({"load", "call", "time"})


class WatchedSandbox:
    """A Sandbox whose requests are bounded by the audit's deadline and whose failures are tallied per stage."""

    def __init__(self, sandbox: Sandbox, deadline: Deadline) -> None:
        self._sandbox, self._deadline = sandbox, deadline
        self.stage = ""
        self.calls_ok = 0
        self.calls_failed = 0
        self.hang: KernelFault | None = None
        self.exhausted = False

    def begin_stage(self, name: str) -> None:
        self.stage, self.calls_ok, self.calls_failed = name, 0, 0

    def send(self, request: Request[ReplyT], *, timeout_s: float | None = None) -> ReplyT:
        op = request.op
        wanted = (
            timeout_s
            if timeout_s is not None
            else (self._deadline.budget.call_timeout_s if op in KERNEL_OPS else self._sandbox.default_timeout_s)
        )
        left = self._deadline.remaining_s()
        if left <= 0:
            self.exhausted = True
            raise BudgetExhausted(f"the audit's budget of {self._deadline.budget.total_s:.0f} s ran out before '{op}'")
        timeout = min(wanted, left)
        try:
            reply: ReplyT = self._sandbox.send(request, timeout_s=timeout)
        except SandboxTimeout as err:
            if timeout < wanted:
                self.exhausted = True
                raise BudgetExhausted(
                    f"the audit's budget of {self._deadline.budget.total_s:.0f} s ran out during '{op}'"
                ) from err
            if op in KERNEL_OPS:
                self.calls_failed += 1
                self.hang = KernelFault(
                    stage=self.stage,
                    kind="hang",
                    message=f"the kernel did not return from '{op}' within {timeout:.0f} s",
                )
            raise
        except (SubmissionError, SandboxCrash):
            if op in KERNEL_OPS:
                self.calls_failed += 1
            raise
        if op in KERNEL_OPS:
            self.calls_ok += 1
        return reply

    def request(self, op: str, payload: dict[str, Any], *, timeout_s: float | None = None) -> dict[str, Any]:
        """Sandbox.request's dict form, bounded and tallied like `send` (not left to the unwatched Sandbox)."""
        return {"ok": True, **self.send(request_for(op, payload), timeout_s=timeout_s).wire()}

    def ensure(self, solution: Solution) -> None:
        """Start the process if needed and import the solution; an import that hangs is the kernel's hang."""
        try:
            self._sandbox.ensure(solution)
        except SandboxTimeout:
            self.calls_failed += 1
            self.hang = KernelFault(
                stage=self.stage,
                kind="hang",
                message="the submission did not finish starting or importing within "
                f"{self._sandbox.default_timeout_s:.0f} s",
            )
            raise
        except (SubmissionError, SandboxCrash):
            self.calls_failed += 1
            raise

    def crashed_on_every_call(self) -> KernelFault | None:
        if self.calls_failed and not self.calls_ok:
            return KernelFault(
                stage=self.stage,
                kind="crash",
                message=f"the kernel failed on every one of its {self.calls_failed} call(s) in {self.stage}",
            )
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sandbox, name)


class BudgetExhausted(SandboxError):
    """The audit's own budget ran out: inconclusive, not the kernel's fault (stages do not catch it as a kernel failure)."""

    kind = "budget"
