"""Run the stages in order; the verdict is the worst of them."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterable

from worker.catalogue import Problem
from worker.context import AuditContext, Progress
from worker.formats import Solution
from worker.sandbox import SandboxError
from worker.stages import verdict as verdict_stage
from worker.stages.result import AuditReport, StageResult, StageStatus

# name -> module with run(ctx) -> StageResult, in the order they run
STAGES: dict[str, str] = {
    "intake": "worker.stages.intake",
    "static": "worker.stages.static",
    "benchmark": "worker.stages.benchmark",
    "probes": "worker.stages.probes",
    "canary": "worker.stages.canary",
}
DEFAULT_STAGES = tuple(STAGES)

OnStage = Callable[[StageResult], None]


def parse_stages(spec: str | Iterable[str] | None) -> tuple[str, ...]:
    if spec is None:
        return DEFAULT_STAGES
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    unknown = [n for n in names if n not in STAGES]
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; choose from {list(STAGES)}")
    if "intake" not in names:
        names.insert(0, "intake")
    return tuple(n for n in STAGES if n in names)


def run_stage(name: str, ctx: AuditContext) -> StageResult:
    module = importlib.import_module(STAGES[name])
    t0 = time.perf_counter()
    try:
        result: StageResult = module.run(ctx)
    except SandboxError as err:
        result = StageResult(
            name=name,
            status=StageStatus.failed if err.kind in ("timeout", "crash", "submission") else StageStatus.error,
            summary=f"the submission's process failed ({err.kind}): {err}",
            evidence={"log": err.log[-2000:]},
        )
    except Exception as err:  # noqa: BLE001 - a stage bug is an error verdict, not a crash of the audit
        if isinstance(err, ctx.interrupts):
            raise
        result = StageResult(name=name, status=StageStatus.error, summary=f"internal error in {name}: {type(err).__name__}: {err}")
    result.duration_s = round(time.perf_counter() - t0, 3)
    return result


def run_audit(
    problem: Problem,
    solution: Solution,
    *,
    device: str = "cpu",
    stages: Iterable[str] | None = None,
    seed: int | None = None,
    progress: Progress | None = None,
    on_stage: OnStage | None = None,
    skip: Iterable[str] = (),
    interrupts: tuple[type[BaseException], ...] = (),
) -> AuditReport:
    """Run the chosen stages; `skip` names stages already finished elsewhere (resumed audits).

    An exception of a type in `interrupts` (a Celery soft time limit) stops the audit and propagates,
    with the sandbox killed, instead of being recorded as the running stage's error.
    """
    chosen = parse_stages(stages)
    ctx = AuditContext(problem=problem, solution=solution, device=device, progress=progress or (lambda _: None),
                       interrupts=tuple(interrupts))
    if seed is not None:
        ctx.seed = seed
    done_elsewhere = set(skip)
    results: list[StageResult] = []
    try:
        for name in DEFAULT_STAGES:
            if name in done_elsewhere:
                continue
            if name not in chosen:
                result = StageResult(name=name, status=StageStatus.skipped, summary="not requested")
            elif results and results[0].name == "intake" and results[0].status is not StageStatus.passed:
                result = StageResult(name=name, status=StageStatus.skipped, summary="intake did not pass")
            else:
                ctx.progress(f"{name}: running")
                result = run_stage(name, ctx)
            ctx.results[name] = result
            results.append(result)
            if on_stage:
                on_stage(result)
    finally:
        ctx.close()
    final = verdict_stage.judge(results)
    if on_stage:
        on_stage(final)
    return AuditReport(
        definition=problem.name,
        solution=solution.name,
        device=device,
        profile=ctx.profile,
        verdict=AuditReport.verdict_of(results),
        summary=final.summary,
        stages=[*results, final],
    )
