"""What every timed pass shares: its sizes, the timing workload's plan, and the record of what was measured.

A re-time must continue the first pass's sequence of input seeds (no timed call repeats an input set) and pool its
blocks with the first pass's, so both the plan and the record outlive one pass."""

from __future__ import annotations

import itertools
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
