"""What the stage reports: the ledger the rounds and the timing fill in, and the StageResult made from it.

The metrics and evidence keys are read by the service (leaderboard, dashboard), by worker.traces and by stored
audits, so they are built in one place and in one order, whichever way the stage ends."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from worker.context import AuditContext
from worker.formats import Workload
from worker.numerics.tolerance import OutputComparison
from worker.problem_spec import Tolerance
from worker.stages.benchmark.failure import Failure
from worker.stages.benchmark.stage import NAME, ROUNDS
from worker.stages.result import StageResult, StageStatus
from worker.traces import environment_of


class WorkloadStats(BaseModel):
    rounds_passed: int = 0
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    min_match_fraction: float = 1.0

    def add(self, c: OutputComparison) -> None:
        self.max_abs_err = max(self.max_abs_err, c.max_abs_err or 0.0)
        self.max_rel_err = max(self.max_rel_err, c.max_rel_err or 0.0)
        if c.match_fraction is not None:
            self.min_match_fraction = min(self.min_match_fraction, c.match_fraction)


@dataclass
class Ledger:
    """What the stage has found so far. `metrics["workloads"]` is `stats` itself, dumped only in the result;
    `current` is the workload being evaluated, the one a failure is recorded against."""

    seeds: dict[str, list[int]]
    stats: dict[str, WorkloadStats]
    metrics: dict[str, Any]
    evidence: dict[str, Any]
    mutated: set[str] = field(default_factory=set)
    current: str = ""
    # each workload's correctness rounds, round trip through the sandbox included: an upper bound on one call
    round_trip_ms: dict[str, list[float]] = field(default_factory=dict)

    def quickest_round_ms(self, uuid: str) -> float | None:
        return min(self.round_trip_ms[uuid]) if self.round_trip_ms.get(uuid) else None

    @classmethod
    def open(cls, ctx: AuditContext, workloads: Sequence[Workload]) -> Ledger:
        seeds: dict[str, list[int]] = {w.uuid: [] for w in workloads}
        evidence: dict[str, Any] = {
            "seeds": seeds,
            "workload_uuids": [w.uuid for w in workloads],
            "rounds": ROUNDS,
            # what a SOL-ExecBench trace records of where and when (worker.traces)
            "environment": environment_of(ctx.device).model_dump(),
            "evaluated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        stats: dict[str, WorkloadStats] = {w.uuid: WorkloadStats() for w in workloads}
        metrics: dict[str, Any] = {"rounds": ROUNDS, "workloads": stats, "passes_benchmark": False}
        return cls(seeds, stats, metrics, evidence, current=workloads[0].uuid if workloads else "")


def no_workloads(ctx: AuditContext) -> StageResult:
    return StageResult(
        name=NAME, status=StageStatus.error, summary=f"no {ctx.profile} workloads for {ctx.problem.name}"
    )


def failed(ledger: Ledger, f: Failure) -> StageResult:
    # what SOL-ExecBench would record: the workloads before this one passed, this one failed so (worker.traces)
    ledger.metrics["official"] = {"workload": ledger.current, "status": f.official}
    ledger.metrics["inputs_mutated"] = sorted(ledger.mutated)
    ledger.evidence.update(f.evidence)
    return StageResult(
        name=NAME,
        status=f.status,
        summary=f.summary,
        metrics=_dump(ledger.metrics),
        evidence=ledger.evidence,
    )


def passed(ledger: Ledger, workloads: Sequence[Workload], tols: dict[str, Tolerance], timing: str) -> StageResult:
    """Every round of every workload within tolerance, and `timing`, the timing's own sentence."""
    mutated = ledger.mutated
    ledger.metrics["inputs_mutated"] = sorted(mutated)
    ledger.metrics["passes_benchmark"] = True
    tol_all = list(tols.values())
    min_frac = min(s.min_match_fraction for s in ledger.stats.values())
    same_tol = all(t == tol_all[0] for t in tol_all)
    summary = (
        f"{ROUNDS}/{ROUNDS} rounds x {len(workloads)} workload(s) within "
        f"{_tol_phrase(tol_all[0]) if same_tol else 'each workload tolerance'} (min {min_frac:.1%} of elements); "
        f"{timing}"
    )
    if mutated:
        summary += f"; note: the kernel modified its input(s) {sorted(mutated)}"
    return StageResult(
        name=NAME, status=StageStatus.passed, summary=summary, metrics=_dump(ledger.metrics), evidence=ledger.evidence
    )


def _tol_phrase(tol: Tolerance) -> str:
    t = f"atol=rtol={tol.atol:g}" if tol.atol == tol.rtol else f"atol={tol.atol:g}, rtol={tol.rtol:g}"
    return t


def _dump(metrics: dict[str, Any]) -> dict[str, Any]:
    out = dict(metrics)
    out["workloads"] = {k: v.model_dump() for k, v in metrics["workloads"].items()}
    return out
