"""A GPU timed pass fits the timing budget: a kernel whose calls take seconds gets fewer timed calls, never fewer
than MIN_TIMED_CALLS, and a quick kernel keeps the full plan (worker.stages.benchmark.timed.plan_blocks). The pass
that runs the plan needs a GPU; the plan itself is arithmetic, checked here."""

from __future__ import annotations

import pytest

from worker.numerics.timing import GPU_TIMING
from worker.numerics.timing_settings import TimingSettings
from worker.stages.benchmark.report import Ledger
from worker.stages.benchmark.timed import GPU_BLOCK_REPS, MIN_TIMED_CALLS, REWARM_CALLS, plan_blocks


def test_a_quick_kernel_keeps_the_full_plan() -> None:
    plan = plan_blocks(GPU_TIMING, block_cap=1000, est_call_ms=150.0, budget_s=60)
    assert not plan.trimmed
    assert (plan.block, plan.warmup, plan.rewarm) == (GPU_BLOCK_REPS, GPU_TIMING.warmup, REWARM_CALLS)
    assert plan.block * plan.n_blocks == GPU_TIMING.reps


def test_no_estimate_keeps_the_full_plan() -> None:
    assert not plan_blocks(GPU_TIMING, 1000, None, 60).trimmed


@pytest.mark.parametrize("call_ms", [600.0, 2_000.0, 9_000.0])
def test_a_slow_kernel_gets_what_the_budget_affords(call_ms: float) -> None:
    full = plan_blocks(GPU_TIMING, 1000, None, 60)
    plan = plan_blocks(GPU_TIMING, 1000, call_ms, 60)
    assert plan.trimmed
    assert plan.calls * call_ms <= 60_000  # warm-up included
    assert plan.block * plan.n_blocks >= MIN_TIMED_CALLS
    assert plan.n_blocks >= 2  # the interval draws blocks
    assert plan.calls < full.calls


def test_a_call_longer_than_the_budget_still_gets_the_minimum() -> None:
    plan = plan_blocks(GPU_TIMING, 1000, 120_000.0, 60)
    assert plan.trimmed and plan.block * plan.n_blocks == MIN_TIMED_CALLS


def test_the_pool_cap_still_bounds_a_block() -> None:
    plan = plan_blocks(GPU_TIMING, 2, 700.0, 60)
    assert plan.block <= 2


def test_the_budget_is_read_from_the_environment() -> None:
    assert TimingSettings.from_env({"KAUDIT_TIMING_BUDGET_S": "5"}).timing_budget_s == 5
    with pytest.raises(ValueError, match="KAUDIT_TIMING_BUDGET_S"):
        TimingSettings.from_env({"KAUDIT_TIMING_BUDGET_S": "-1"})


def test_the_estimate_is_the_quickest_round() -> None:
    ledger = Ledger({}, {}, {}, {}, round_trip_ms={"w": [900.0, 450.0, 700.0]})
    assert ledger.quickest_round_ms("w") == 450.0
    assert ledger.quickest_round_ms("other") is None
