"""Stage 3, benchmark: what SOL-ExecBench's own verifier does, so "passes the benchmark" means the same here.

For each workload, ROUNDS rounds of fresh inputs judged by the elementwise rule against the reference run in the
trusted process; then the kernel timed against the reference timed here, in the device's exclusive window, with a
speedup interval and a physical floor, so that the submission can forge neither its outputs nor its time.

The modules, in the order the stage uses them: workloads (the timed workload, tolerances, reference outputs),
correctness (the rounds: fresh inputs, NaN-poisoned outputs, the elementwise rule), calls (every sandbox request,
with its liveness check), timing (the timed passes and the speedup), with timed (the plan and the record the
passes share), reference_clock (the reference's blocks), passes (the interleaved blocks inside the window) and
floor (the physical floor), then report (status, summary, metrics, evidence). failure holds the exception every
check raises.
"""

from __future__ import annotations

from worker.context import AuditContext
from worker.stages.benchmark.correctness import run_rounds
from worker.stages.benchmark.failure import Failure
from worker.stages.benchmark.floor import FLOOR_PHRASE
from worker.stages.benchmark.report import Ledger, failed, no_workloads, passed
from worker.stages.benchmark.stage import NAME, ROUNDS
from worker.stages.benchmark.timed import (
    GPU_BLOCK_REPS,
    GPU_MAX_BLOCKS,
    REWARM_CALLS,
    TIMING_CHECKS,
    TIMING_POOL_BYTES,
)
from worker.stages.benchmark.timing import time_kernel as _time
from worker.stages.benchmark.workloads import reference_outputs, timing_workload, to_device, tolerance_for
from worker.stages.result import StageResult

# importers outside the stage: the engine (run), tests (ROUNDS, FLOOR_PHRASE, timing_workload) and the scripts in
# benchmarks/ (timing_workload, to_device); _time is the timing alone (timing.time_kernel)
__all__ = [
    "FLOOR_PHRASE",
    "GPU_BLOCK_REPS",
    "GPU_MAX_BLOCKS",
    "NAME",
    "REWARM_CALLS",
    "ROUNDS",
    "TIMING_CHECKS",
    "TIMING_POOL_BYTES",
    "_time",
    "reference_outputs",
    "run",
    "timing_workload",
    "to_device",
    "tolerance_for",
]


def run(ctx: AuditContext) -> StageResult:
    problem = ctx.problem
    workloads = problem.workloads(ctx.profile)
    ledger = Ledger.open(ctx, workloads)
    if not workloads:
        return no_workloads(ctx)
    try:
        sb = ctx.sandbox()
        tols = {w.uuid: tolerance_for(problem, w) for w in workloads}
        run_rounds(ctx, sb, workloads, tols, ledger)
        ledger.current = timing_workload(problem, ctx.profile).uuid
        timing = _time(ctx, sb, ledger.metrics, ledger.evidence, ledger.quickest_round_ms(ledger.current))
    except Failure as f:
        return failed(ledger, f)
    return passed(ledger, workloads, tols, timing)
