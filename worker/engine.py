"""The audit's lifecycle: run the stages in order, resume from results stored by an earlier attempt,
stop early when going on would only repeat the kernel's fault, and judge the whole.

The service's task only claims the audit, stores what this reports through `on_stage`, and finishes it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import cache
from importlib import import_module

import torch

from worker.budget import AuditBudget, KernelFault
from worker.catalogue import Problem
from worker.context import AuditContext, Progress
from worker.formats import Solution
from worker.inputs import MissingInputFile
from worker.numerics import gpu_memory
from worker.sandbox import Isolation, SandboxError, SandboxOutOfMemory
from worker.sandbox.pool import SandboxPool
from worker import registry
from worker.report import AuditOutcome, AuditReport, StageResult, StageStatus
from worker.stages import verdict as verdict_stage
from worker.traces import traces_of_stages

StageRun = Callable[[AuditContext], StageResult]


@cache
def _run_of(module: str) -> StageRun:
    run = getattr(import_module(module), "run", None)
    if not callable(run):
        raise TypeError(f"stage module {module} has no run(ctx)")
    return run  # type: ignore[no-any-return]


def stage_runs() -> dict[str, StageRun]:
    """Every registered stage's `run` (worker.registry), in the order they run; a module loads on its first use."""
    return {name: _run_of(module) for name, module in registry.stage_modules().items()}


# the built-in stages load with the engine (a worker's pool process imports it before its first audit); a stage
# registered from the settings loads when it first runs, so a module that fails to import is that stage's error
for _module in registry.BUILT_IN:
    _run_of(_module)

OnStage = Callable[[StageResult], None]


def parse_stages(spec: str | Iterable[str] | None) -> tuple[str, ...]:
    known = registry.audit_stages()
    if spec is None:
        return known
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; choose from {list(known)}")
    if registry.INTAKE not in names:
        names.insert(0, registry.INTAKE)
    return tuple(n for n in known if n in names)


def run_stage(name: str, ctx: AuditContext) -> StageResult:
    ctx.begin_stage(name)
    t0 = time.perf_counter()
    # a neighbour's stage that ran out of memory runs again first, with the memory the card has left
    held_off = gpu_memory.make_way(ctx.device)
    retries = 0
    turn: AbstractContextManager[None] = nullcontext()
    while True:
        outcome = _attempt_stage(name, ctx, turn)
        if isinstance(outcome, StageResult):
            result = outcome
            break
        message, interrupted = outcome
        if retries >= gpu_memory.OOM_RETRIES or interrupted:
            result = StageResult(
                name=name,
                status=StageStatus.error,
                summary=(
                    f"inconclusive: the device ran out of memory in {name} on {retries + 1} attempt(s) ({message}); "
                    "not counted against the kernel"
                ),
            )
            break
        # on a GPU several audits share, running out of memory is usually the neighbours' load: wait for memory to
        # come back and run the stage again before calling it inconclusive
        retries += 1
        ctx.progress(f"{name}: the device ran out of memory; waiting for memory, then attempt {retries + 1}")
        ctx.end_processes()  # what the audit's children hold goes back with them
        gpu_memory.release(ctx.device)
        # the next attempt waits its turn among the device's retries, then for the memory this one needed
        turn = gpu_memory.retry_turn(ctx.device, gpu_memory.need_after_oom(message))
    if retries:
        result.metrics["out_of_memory_retries"] = retries
    if held_off >= 1.0:
        result.metrics["held_off_for_a_retry_s"] = round(held_off, 1)
    result.duration_s = round(time.perf_counter() - t0, 3)
    gpu_memory.release(ctx.device)
    return _judge_faults(ctx, result)


OutOfMemory = tuple[str, bool]  # the error's message, and whether it is one of the audit's interrupts


def _attempt_stage(name: str, ctx: AuditContext, turn: AbstractContextManager[None]) -> StageResult | OutOfMemory:
    """One run of the stage, after waiting its `turn`. Running out of device memory comes back as the message, for
    run_stage to retry, and only as a return value: while the exception lives, its traceback keeps the failed attempt's
    frames and their tensors alive, and emptying the allocator's cache then gives none of them back. What the audit's
    children hold goes back only with them: run_stage ends them before a retry (AuditContext.end_processes)."""
    try:
        with turn:
            return _run_of(registry.stage_modules()[name])(ctx)
    except (torch.OutOfMemoryError, SandboxOutOfMemory) as err:  # before SandboxError, which it is a kind of
        return str(err), isinstance(err, ctx.interrupts)
    except SandboxError as err:
        # a timeout is the kernel's only when a kernel call hung (the watch saw it); the auditor's own work
        # running long (the canary's training) or the audit's budget running out is inconclusive
        hung = ctx.watch is not None and ctx.watch.hang is not None
        kernel_fault = err.kind in ("crash", "submission") or (err.kind == "timeout" and hung)
        return StageResult(
            name=name,
            status=StageStatus.failed if kernel_fault else StageStatus.error,
            summary=(
                f"the submission's process failed ({err.kind}): {err}"
                if kernel_fault
                else f"inconclusive: {err}; not counted against the kernel"
            ),
            evidence={"log": err.log[-2000:]},
        )
    except MissingInputFile as err:  # the problem's data, not the kernel nor the auditor: say which file
        return StageResult(name=name, status=StageStatus.error, summary=str(err))
    except Exception as err:  # a stage bug is an error verdict, not a crash of the audit
        if isinstance(err, ctx.interrupts):
            raise
        return StageResult(
            name=name, status=StageStatus.error, summary=f"internal error in {name}: {type(err).__name__}: {err}"
        )


def _judge_faults(ctx: AuditContext, result: StageResult) -> StageResult:
    """What the watched sandbox saw overrides a stage that swallowed it: a hang fails the stage, a budget cut is inconclusive."""
    watch = ctx.watch
    if watch is None:
        return result
    if watch.hang is not None and watch.hang.stage == result.name:
        result.status = StageStatus.failed
        result.metrics["kernel_fault"] = watch.hang.model_dump()
        if watch.hang.message not in result.summary:
            result.summary = f"{watch.hang.message}; {result.summary}"
    elif watch.exhausted and result.status is not StageStatus.error:
        result.status = StageStatus.error
        result.summary = (
            f"inconclusive: the audit's budget ran out during {result.name}; not counted against the kernel"
        )
    return result


def _stop_reason(ctx: AuditContext, result: StageResult) -> tuple[str, KernelFault | None] | None:
    """Why the stages after `result` should not run, if they should not."""
    watch = ctx.watch
    if watch is not None and watch.hang is not None:
        return f"not run: the kernel hung in {watch.hang.stage} ({watch.hang.message})", watch.hang
    if result.name == registry.INTAKE and result.status is not StageStatus.passed:
        return "intake did not pass", None
    if watch is None:
        return None
    if watch.exhausted:
        return "not run: the audit's budget ran out (inconclusive, not counted against the kernel)", None
    crash = watch.crashed_on_every_call()
    if crash is not None and result.status is StageStatus.failed:
        return f"not run: {crash.message}; later stages would only repeat it", crash
    return None


def run_audit(
    problem: Problem,
    solution: Solution,
    *,
    device: str = "cpu",
    stages: Iterable[str] | None = None,
    seed: int | None = None,
    progress: Progress | None = None,
    on_stage: OnStage | None = None,
    resume: Sequence[StageResult] = (),
    budget: AuditBudget | None = None,
    isolation: Isolation | None = None,
    interrupts: tuple[type[BaseException], ...] = (),
    pool: SandboxPool | None = None,
) -> AuditReport:
    """Run the chosen stages and judge them.

    `resume` holds stage results an earlier attempt of this audit already stored: those stages are not run
    again (and not reported to `on_stage`), but they count in the verdict. `on_stage` hears every new stage
    result, then the verdict. An exception of a type in `interrupts` (a Celery soft time limit) stops the
    audit and propagates, with the sandbox killed, instead of being recorded as the running stage's error.
    `pool` (a worker process's spare children) gives the audit a child started ahead of it.
    """
    chosen = parse_stages(stages)
    ctx = AuditContext(
        problem=problem,
        solution=solution,
        device=device,
        progress=progress or (lambda _: None),
        interrupts=tuple(interrupts),
        budget=budget,
        isolation=isolation,
        pool=pool,
    )
    if seed is not None:
        ctx.seed = seed
    order = registry.audit_stages()
    done = {r.name: r for r in resume if r.name in order}
    results: list[StageResult] = []
    stop: tuple[str, KernelFault | None] | None = None
    ctx.deadline  # noqa: B018 - the budget's clock starts now
    try:
        for name in order:
            if name in done:
                result = done[name]
            else:
                if name not in chosen:
                    result = StageResult(name=name, status=StageStatus.skipped, summary="not requested")
                elif stop is not None:
                    result = StageResult(name=name, status=StageStatus.skipped, summary=stop[0])
                else:
                    ctx.progress(f"{name}: running")
                    result = run_stage(name, ctx)
                if on_stage:
                    on_stage(result)
            ctx.results[name] = result
            results.append(result)
            if stop is None:
                stop = _stop_reason(ctx, result)
    finally:
        ctx.close()
    final = verdict_stage.judge(results)
    fault = stop[1] if stop is not None else None
    outcome = AuditOutcome.of(AuditReport.verdict_of(results))
    if fault is not None and fault.kind == "hang":
        outcome = AuditOutcome.timed_out
        final.summary = f"timed_out: {fault.message} (in {fault.stage}); {final.summary}"
        final.metrics["kernel_fault"] = fault.model_dump()
    # which isolation the submission ran under ("none" is said in every report and on the dashboard)
    final.metrics["isolation"] = ctx.isolation or "not started"
    final.metrics["sandbox_memory"] = ctx.memory_note
    # what SOL-ExecBench itself would record, per evaluated workload (worker.traces): kept with the verdict so the
    # service can answer GET /v1/submissions/{id}/traces without the catalogue
    final.evidence["traces"] = [
        t.model_dump(mode="json", exclude_none=True)
        for t in traces_of_stages(results, problem.name, device, solution.name, list(problem.workloads(ctx.profile)))
    ]
    if on_stage:
        on_stage(final)
    return AuditReport(
        definition=problem.name,
        solution=solution.name,
        device=device,
        profile=ctx.profile,
        verdict=AuditReport.verdict_of(results),
        outcome=outcome,
        isolation=ctx.isolation,
        summary=final.summary,
        stages=[*results, final],
    )
