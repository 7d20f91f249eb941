"""The one way a check anywhere in the stage stops it: raise Failure, and run() turns it into the stage's result.

A check deep in a timed pass knows the summary, the status and the evidence; only run() knows the workload that was
being evaluated and what the rounds before it found, so the failure carries the former up to the latter."""

from __future__ import annotations

from typing import Any

from worker.report import WORKER_LIMIT
from worker.sandbox import interpreter_bf16
from worker.stages.result import StageStatus


class Failure(Exception):
    """`official`: the status SOL-ExecBench's own evaluator would record for the workload (worker.traces)."""

    def __init__(
        self,
        summary: str,
        status: StageStatus = StageStatus.failed,
        *,
        official: str = "RUNTIME_ERROR",
        **evidence: Any,
    ) -> None:
        super().__init__(summary)
        self.summary = summary
        self.status = status
        self.official = official
        self.evidence = evidence


def made_mismatch(where: str) -> Failure:
    return Failure(
        f"{where}: the inputs the sandbox made from their seeds are not the ones this process made "
        "(another GPU or torch build in the sandbox, or a tampered generator); the outputs cannot be judged",
        StageStatus.error,
    )


def interpreter_bf16_failure(where: str, op: str, numeric: Failure) -> Failure:
    """Outputs out of tolerance from a Triton kernel that did bf16 arithmetic under the CPU interpreter, which
    computes bf16 wrongly (worker.sandbox.interpreter_bf16): inconclusive on this worker, not the kernel's fault."""
    return Failure(
        f"{where}: {interpreter_bf16.inconclusive(op)}",
        StageStatus.error,
        official="RUNTIME_ERROR",
        interpreter_bf16=op,
        comparison_on_this_worker=numeric.evidence.get("comparison"),
        **{WORKER_LIMIT: interpreter_bf16.LIMIT},
    )
