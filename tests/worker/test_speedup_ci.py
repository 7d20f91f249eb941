"""The speedup's confidence interval (worker.numerics.speedup) and the benchmark stage that records it."""

from __future__ import annotations

import numpy as np
import pytest

from worker.catalogue import load_catalogue
from worker.engine import run_audit
from worker.numerics.speedup import speedup_interval
from worker.numerics.timing import CPU_TIMING
from worker.numerics.timing_settings import TimingSettings
from worker.stages.benchmark.timing import _interval, _speed_phrase
from worker.stages.result import StageStatus

EMB = load_catalogue().get("embedding_backward")


def _blocks(
    rng: np.random.Generator, median_ms: float, blocks: int, per_block: int, drift: np.ndarray, noise: float
) -> list[list[float]]:
    """Timings whose population median is `median_ms` times each block's drift factor, with lognormal noise."""
    return [list(median_ms * drift[b] * rng.lognormal(0.0, noise, per_block)) for b in range(blocks)]


def test_the_interval_is_seeded_holds_the_estimate_and_narrows_with_more_blocks() -> None:
    rng = np.random.default_rng(1)
    flat = np.ones(40)
    kernel, ref = _blocks(rng, 1.0, 40, 10, flat, 0.2), _blocks(rng, 2.0, 40, 10, flat, 0.2)
    few = speedup_interval(kernel[:4], ref[:4], seed=7)
    assert few == speedup_interval(kernel[:4], ref[:4], seed=7)  # the audit's seed: recomputable from stored times
    assert few.lo <= few.speedup <= few.hi and few.blocks == 4
    assert few.speedup == pytest.approx(np.median(np.concatenate(ref[:4])) / np.median(np.concatenate(kernel[:4])))
    many = speedup_interval(kernel, ref, seed=7)
    assert many.rel_width < few.rel_width
    assert many.lo < 2.0 < many.hi


def test_the_95_percent_interval_covers_the_true_speedup_about_95_percent_of_the_time() -> None:
    rng = np.random.default_rng(2)
    covered, runs = 0, 200
    for i in range(runs):
        # a block-level wobble (clocks, a neighbour) on top of per-call noise, shared by the pair
        drift = rng.lognormal(0.0, 0.05, 10)
        est = speedup_interval(_blocks(rng, 0.5, 10, 10, drift, 0.1), _blocks(rng, 1.5, 10, 10, drift, 0.1), seed=i)
        covered += est.lo <= 3.0 <= est.hi
    assert covered / runs >= 0.9


def test_a_drift_that_hits_both_sides_of_a_block_cancels_in_the_paired_interval() -> None:
    """The host slows down block by block (x1 to x2): interleaved blocks see it on both sides, so the ratio and
    its interval stay on the truth, whereas the kernel's own times spread over the whole factor of two."""
    rng = np.random.default_rng(3)
    drift = np.linspace(1.0, 2.0, 10)
    kernel, ref = _blocks(rng, 1.0, 10, 10, drift, 0.01), _blocks(rng, 4.0, 10, 10, drift, 0.01)
    est = speedup_interval(kernel, ref, seed=0)
    assert est.lo <= 4.0 <= est.hi and est.rel_width < 0.05
    spread = np.ptp(np.concatenate(kernel)) / np.median(np.concatenate(kernel))
    assert spread > 0.6


def test_blocks_must_pair_up_and_times_must_be_positive() -> None:
    with pytest.raises(ValueError, match="pair up"):
        speedup_interval([[1.0], [1.0]], [[2.0]], seed=0)
    with pytest.raises(ValueError, match="finite and positive"):
        speedup_interval([[1.0, 0.0]], [[2.0, 2.0]], seed=0)
    with pytest.raises(ValueError, match="at least one timing"):
        speedup_interval([[1.0], []], [[2.0], [2.0]], seed=0)


def test_the_retime_threshold_is_per_device_and_set_from_the_environment() -> None:
    s = TimingSettings.from_env({"KAUDIT_RETIME_REL_WIDTH_GPU": "0.05"})
    assert s.retime_threshold("cuda:0") == 0.05 and s.retime_threshold("cpu") == TimingSettings().retime_rel_width_cpu
    with pytest.raises(ValueError):
        TimingSettings.from_env({"KAUDIT_RETIME_REL_WIDTH_CPU": "-1"})


def test_the_stage_records_the_interval_and_times_again_when_it_is_wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any interval is wider than a threshold of zero: the stage times once more, with fresh inputs, and pools."""
    monkeypatch.setenv("KAUDIT_RETIME_REL_WIDTH_CPU", "1e-12")
    report = run_audit(EMB, EMB.example_solution("pytorch_fp32"), stages=["intake", "benchmark"], seed=11)
    bench = {s.name: s for s in report.stages}["benchmark"]
    assert bench.status is StageStatus.passed, bench.summary
    m, timing = bench.metrics, bench.metrics["timing"]
    lo, hi = m["speedup_ci"]
    assert lo <= m["speedup"] <= hi and timing["speedup_ci"] == [lo, hi] and timing["speedup"] == m["speedup"]
    assert timing["speedup_ci_level"] == 0.95 and "bootstrap" in timing["speedup_ci_method"]
    assert m["indicative"] is True and timing["indicative"] is True and timing["hardware"] == "cpu"
    assert "indicative only" in bench.summary and "95% interval" in bench.summary
    # two passes of CPU_TIMING.reps single-call blocks, kernel and reference interleaved
    assert timing["retimed"] is True and len(timing["first_speedup_ci"]) == 2
    assert timing["reps"] == timing["blocks"] == 2 * CPU_TIMING.reps
    assert timing["fresh_inputs"] == timing["warmup"] + timing["reps"]  # still no input set timed twice


@pytest.mark.parametrize(
    ("speedup", "lo", "hi", "phrase", "interval"),
    [
        (9.86, 9.85, 9.87, "9.86x faster than reference", "9.85x-9.87x"),
        # a slow kernel's interval reads in its headline's unit: around 40x slower, not around 0.025x
        (1 / 40, 1 / 41.3, 1 / 38.3, "40.00x slower than reference", "38.3x-41.3x"),
        # an interval that straddles parity: the slower end past 1x, the faster end under it
        (1 / 1.16, 0.75, 1.07, "1.16x slower than reference", "0.935x-1.33x"),
    ],
)
def test_the_interval_reads_in_the_unit_of_the_speed_phrase(
    speedup: float, lo: float, hi: float, phrase: str, interval: str
) -> None:
    assert _speed_phrase(speedup) == phrase
    assert _interval(speedup, lo, hi) == interval
