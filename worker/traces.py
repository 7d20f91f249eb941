"""SOL-ExecBench traces out of an audit: what the benchmark's own evaluator would record, workload by workload.

A trace (SOL-ExecBench's `docs/trace.md`) names the definition, the solution and one workload, with an evaluation:
a status, correctness (max absolute and relative error), performance (latency, reference latency, speedup) and the
environment. kernel-audit's benchmark stage runs that evaluator's rule (worker.stages.benchmark); its per-workload
results become traces here. The audit's own findings (probes, canary) stay in kernel-audit's report: a trace says
what SOL-ExecBench itself would say, no more.

How each status is decided:
- intake could not build or load the solution: COMPILE_ERROR (a compiled language, or a load error), every workload;
- the static stage found a reward hack: REWARD_HACK, every workload (SOL-ExecBench's own check refuses such code);
- the benchmark stage: the workloads before the first failing one PASSED, that one its failure's status
  (INCORRECT_SHAPE, INCORRECT_DTYPE, INCORRECT_NUMERICAL, RUNTIME_ERROR, TIMEOUT, REWARD_HACK, INVALID_REFERENCE);
  workloads after it were not evaluated and get no trace.
kernel-audit times one workload (the largest); the others' `performance` is zeros, and `log` says so.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from worker.formats import Solution, Workload
from worker.stages.result import AuditReport, StageResult, StageStatus


class EvaluationStatus(StrEnum):
    PASSED = "PASSED"
    INCORRECT_SHAPE = "INCORRECT_SHAPE"
    INCORRECT_NUMERICAL = "INCORRECT_NUMERICAL"
    INCORRECT_DTYPE = "INCORRECT_DTYPE"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    COMPILE_ERROR = "COMPILE_ERROR"
    TIMEOUT = "TIMEOUT"
    REWARD_HACK = "REWARD_HACK"
    INVALID_REFERENCE = "INVALID_REFERENCE"


class Correctness(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="strings")
    max_relative_error: float = 0.0
    max_absolute_error: float = 0.0
    extra: dict[str, Any] | None = None


class Performance(BaseModel):
    latency_ms: float = Field(0.0, ge=0.0)
    reference_latency_ms: float = Field(0.0, ge=0.0)
    speedup_factor: float = Field(0.0, ge=0.0)


class Environment(BaseModel):
    hardware: str = Field(min_length=1)
    libs: dict[str, str] = Field(default_factory=dict)


class Evaluation(BaseModel):
    status: EvaluationStatus
    environment: Environment
    timestamp: str = Field(min_length=1)
    log: str = ""
    correctness: Correctness | None = None
    performance: Performance | None = None

    @model_validator(mode="after")
    def _fields_follow_status(self) -> "Evaluation":
        """As the official schema: PASSED has both, INCORRECT_NUMERICAL correctness only, the rest neither."""
        want = {EvaluationStatus.PASSED: (True, True), EvaluationStatus.INCORRECT_NUMERICAL: (True, False)}
        c, p = want.get(self.status, (False, False))
        if (self.correctness is not None) != c or (self.performance is not None) != p:
            raise ValueError(
                f"status {self.status.value}: correctness {'required' if c else 'not allowed'}, "
                f"performance {'required' if p else 'not allowed'}"
            )
        return self


class Trace(BaseModel):
    definition: str = Field(min_length=1)
    workload: dict[str, Any]
    solution: str | None = None
    evaluation: Evaluation | None = None


_INTAKE_STATUS = EvaluationStatus.COMPILE_ERROR


def _finite(v: object) -> float:
    return float(v) if isinstance(v, int | float) and math.isfinite(float(v)) else 0.0


def _stage(stages: list[StageResult], name: str) -> StageResult | None:
    return next((s for s in stages if s.name == name), None)


def _all(status: EvaluationStatus, log: str, workloads: list[Workload]) -> dict[str, tuple[EvaluationStatus, str]]:
    return {w.uuid: (status, log) for w in workloads}


def _statuses(stages: list[StageResult], workloads: list[Workload]) -> dict[str, tuple[EvaluationStatus, str]]:
    """Each evaluated workload's status and log line."""
    intake, static, bench = _stage(stages, "intake"), _stage(stages, "static"), _stage(stages, "benchmark")
    if intake is not None and intake.status in (StageStatus.failed, StageStatus.error):
        return _all(_INTAKE_STATUS, intake.summary, workloads)
    if static is not None and static.status is StageStatus.failed:
        return _all(EvaluationStatus.REWARD_HACK, static.summary, workloads)
    if bench is None or bench.status is StageStatus.skipped:
        return {}
    official = bench.metrics.get("official") or {}
    failed_at, failed_as = official.get("workload"), official.get("status")
    if bench.status is not StageStatus.passed and failed_as not in EvaluationStatus.__members__:
        return _all(EvaluationStatus.RUNTIME_ERROR, bench.summary, workloads)  # stopped before naming a workload
    rounds = bench.metrics.get("rounds")
    stats: dict[str, dict[str, Any]] = bench.metrics.get("workloads") or {}
    out: dict[str, tuple[EvaluationStatus, str]] = {}
    for w in workloads:
        if w.uuid == failed_at:
            out[w.uuid] = (EvaluationStatus(failed_as), bench.summary)
        elif rounds is not None and stats.get(w.uuid, {}).get("rounds_passed") == rounds:
            out[w.uuid] = (EvaluationStatus.PASSED, "")
    return out


def traces_of(report: AuditReport, solution: Solution, workloads: list[Workload]) -> list[Trace]:
    """One trace per evaluated workload of `report`, in the official schema."""
    return traces_of_stages(report.stages, report.definition, report.device, solution.name, workloads)


def traces_of_stages(
    stages: list[StageResult], definition: str, device: str, solution: str, workloads: list[Workload]
) -> list[Trace]:
    """One trace per evaluated workload, from the stages' results. The environment and the time are the benchmark
    stage's own (its evidence); an audit that never reached it has neither, and says so."""
    bench = _stage(stages, "benchmark")
    metrics = bench.metrics if bench is not None else {}
    evidence = bench.evidence if bench is not None else {}
    environment = Environment.model_validate(evidence.get("environment") or {"hardware": f"unknown ({device})"})
    timestamp = str(evidence.get("evaluated_at") or "not evaluated")
    per_workload: dict[str, dict[str, Any]] = metrics.get("workloads") or {}
    timing: dict[str, Any] = metrics.get("timing") or {}
    traces = []
    judged_all = _statuses(stages, workloads)
    for w in workloads:
        judged = judged_all.get(w.uuid)
        if judged is None:
            continue
        status, log = judged
        stats = per_workload.get(w.uuid, {})
        correctness = performance = None
        if status in (EvaluationStatus.PASSED, EvaluationStatus.INCORRECT_NUMERICAL):
            correctness = Correctness(
                max_relative_error=_finite(stats.get("max_rel_err")),
                max_absolute_error=_finite(stats.get("max_abs_err")),
                extra={
                    "rounds_passed": stats.get("rounds_passed"),
                    "min_match_fraction": stats.get("min_match_fraction"),
                },
            )
        if status is EvaluationStatus.PASSED:
            if timing.get("workload") == w.uuid and timing.get("kernel_median_ms") is not None:
                performance = Performance(
                    latency_ms=_finite(timing.get("kernel_median_ms")),
                    reference_latency_ms=_finite(timing.get("reference_median_ms")),
                    speedup_factor=_finite(timing.get("speedup")),
                )
            else:
                performance = Performance()
                log = f"not timed: kernel-audit times one workload ({timing.get('workload', 'none')})"
        traces.append(
            Trace(
                definition=definition,
                workload=w.model_dump(mode="json", exclude_none=True),
                solution=solution,
                evaluation=Evaluation(
                    status=status,
                    environment=environment,
                    timestamp=timestamp,
                    log=log[:4000],
                    correctness=correctness,
                    performance=performance,
                ),
            )
        )
    return traces


def to_jsonl(traces: list[Trace]) -> str:
    return "".join(t.model_dump_json(exclude_none=True) + "\n" for t in traces)


def environment_of(device: str) -> Environment:
    """The hardware and library versions of this worker, as a trace records them."""
    import platform

    import torch

    libs = {"torch": str(torch.__version__)}
    try:
        import triton

        libs["triton"] = str(triton.__version__)
    except ImportError:
        pass
    if device.startswith("cuda") and torch.cuda.is_available():
        hardware = torch.cuda.get_device_name(torch.device(device)).replace(" ", "_")
        if torch.version.cuda:
            libs["cuda"] = str(torch.version.cuda)
    else:
        hardware = f"CPU_{platform.machine() or 'unknown'}"
    return Environment(hardware=hardware, libs=libs)
