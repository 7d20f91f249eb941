"""What every timed pass shares: its sizes, the timing workload's plan, and the record of what was measured.

A re-time must continue the first pass's sequence of input seeds (no timed call repeats an input set) and pool its
blocks with the first pass's, so both the plan and the record outlive one pass."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from worker.context import AuditContext
from worker.formats import Workload
from worker.inputs import Case, build_case
from worker.numerics.speedup import SpeedupInterval, speedup_interval
from worker.numerics.timed_window import WindowRecord
from worker.numerics.timing import TimingConfig, TimingSample
from worker.numerics.timing_settings import TimingSettings
from worker.problem_spec import Tolerance
from worker.sandbox import Sandbox

TIMING_POOL_BYTES = 4 * 1024**3  # GPU: one request's distinct input sets together stay under this
TIMING_CHECKS = 5  # GPU: timed calls per pass whose outputs the parent judges, drawn at random after the inputs
GPU_BLOCK_REPS = 10  # GPU: timed calls per interleaved block (a CPU block is one call: each is a slow round trip)
GPU_MAX_BLOCKS = 20  # GPU: when few input sets fit the pool, more (smaller) blocks, up to this many
REWARM_CALLS = 2  # GPU: warm-up calls before every block after the first (the other side ran in between)
# GPU: a kernel whose calls take seconds would hold the device's exclusive timed window for many minutes at the full
# plan (a K-loop GEMM at 9 s a call: 128 calls, 19 minutes), and every other audit of the device waits for it; below
# this many timed calls no interval is worth reporting, whatever the budget
MIN_TIMED_CALLS = 3
# GPU: a pass still running at this multiple of the budget (its calls slower than the correctness rounds promised)
# stops after the block in progress, once MIN_TIMED_CALLS are timed
OVERRUN_FACTOR = 2.0


@dataclass(frozen=True)
class BlockPlan:
    """How one GPU pass is split: `n_blocks` blocks of `block` timed calls, `warmup` untimed calls before the first
    and `rewarm` before each later one. `trimmed`: the full plan would not fit the timing budget at the estimated
    call time, so this is the most it affords (never fewer than MIN_TIMED_CALLS timed calls)."""

    block: int
    n_blocks: int
    warmup: int
    rewarm: int
    trimmed: bool = False

    @property
    def calls(self) -> int:
        return self.warmup + self.block * self.n_blocks + self.rewarm * (self.n_blocks - 1)


def plan_blocks(cfg: TimingConfig, block_cap: int, est_call_ms: float | None, budget_s: float) -> BlockPlan:
    """The full plan (`cfg.reps` calls in blocks of at most GPU_BLOCK_REPS, or `block_cap` when fewer input sets fit
    the pool), unless its calls at `est_call_ms` each (an upper bound: the correctness rounds' round trips) would
    take longer than `budget_s`. Then one warm-up call, no re-warm (a call that long is not shaped by what the
    reference left in the caches, and the L2 is flushed anyway), and as many blocks as the budget affords, so that
    the interval still has blocks to draw from."""
    block = max(1, min(GPU_BLOCK_REPS, block_cap))
    full = BlockPlan(block, min(GPU_MAX_BLOCKS, max(1, math.ceil(cfg.reps / block))), cfg.warmup, REWARM_CALLS)
    if est_call_ms is None or est_call_ms <= 0 or full.calls * est_call_ms <= budget_s * 1e3:
        return full
    timed_calls = max(MIN_TIMED_CALLS, int(budget_s * 1e3 // est_call_ms) - 1)
    n_blocks = min(GPU_MAX_BLOCKS, timed_calls, full.n_blocks * full.block)
    return BlockPlan(max(1, min(block, timed_calls // n_blocks)), n_blocks, min(1, cfg.warmup), 0, trimmed=True)


ReferenceBlock = Callable[[int, int], TimingSample]  # (warm-up calls, timed calls) -> one block of the reference


@dataclass
class TimingPlan:
    """The timing workload and how it is timed. `seed` makes the first timed input set (and the reference's
    inputs); every later set has its own seed, drawn in order by `fresh`."""

    ctx: AuditContext
    sb: Sandbox
    workload: Workload
    cfg: TimingConfig
    settings: TimingSettings
    tol: Tolerance
    seed: int
    where: str
    gpu: bool
    est_call_ms: float | None = None  # an upper bound on one kernel call: the timing workload's correctness rounds
    counter: Iterator[int] = field(default_factory=itertools.count)

    def fresh(self) -> Case:
        # on the GPU the input sets stay recipes: the child makes them on its device, this process only the ones it checks
        i = next(self.counter)
        ctx, problem = self.ctx, self.ctx.problem
        case_seed = self.seed if i == 0 else ctx.derive_seed("benchmark", "timing", self.workload.uuid, i)
        return build_case(
            problem.definition,
            ctx.reference,
            self.workload,
            case_seed,
            folder=problem.folder,
            device=ctx.device,
            lazy=self.gpu,
        )


@dataclass
class Timed:
    """What the timed passes measured, block by block; a re-time adds its blocks to the first pass's."""

    kernel: list[TimingSample] = field(default_factory=list)
    reference: list[TimingSample] = field(default_factory=list)
    tampered: set[str] = field(default_factory=set)
    warmup: int = 0
    fresh_inputs: int = 0
    checked: list[int] = field(default_factory=list)
    request_wall_ms: float = 0.0
    windows: list[WindowRecord] = field(default_factory=list)
    plans: list[BlockPlan] = field(default_factory=list)  # GPU: each pass's split
    cut_short: bool = False  # GPU: a pass overran the budget and stopped before its last block

    @property
    def reps(self) -> int:
        return sum(len(b.times_ms) for b in self.kernel)

    def kernel_sample(self) -> TimingSample:
        host = [h for b in self.kernel for h in (b.host_times_ms or [])]
        return TimingSample(
            times_ms=[t for b in self.kernel for t in b.times_ms],
            clock=self.kernel[0].clock,
            host_times_ms=host if len(host) == self.reps else None,
        )

    def interval(self, seed: int) -> SpeedupInterval | None:
        if not self.reference:
            return None
        return speedup_interval([b.times_ms for b in self.kernel], [b.times_ms for b in self.reference], seed=seed)
