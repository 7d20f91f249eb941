"""The one way a check anywhere in the stage stops it: raise Failure, and run() turns it into the stage's result.

A check deep in a timed pass knows the summary, the status and the evidence; only run() knows the workload that was
being evaluated and what the rounds before it found, so the failure carries the former up to the latter."""

from __future__ import annotations

from typing import Any

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
