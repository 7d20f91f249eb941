"""The benchmark stage: SOL-ExecBench's verifier (fresh rounds, elementwise rule, timing) on the CPU profile."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from worker.catalogue import load_catalogue
from worker.context import AuditContext
from worker.engine import run_audit
from worker.formats import Solution, SolutionSpec, SourceFile, solution_from_python_file
from worker.inputs import build_case
from worker.numerics.timing import (
    CPU_TIMING,
    GPU_TIMING,
    LAUNCH_BOUND_SHARE,
    TimingSample,
    time_trusted,
)
from worker.numerics.tolerance import compare_output
from worker.problem_spec import Tolerance
from worker.stages.benchmark import ROUNDS, timing_workload
from worker.stages.benchmark.timed import plan_blocks
from worker.stages.result import StageResult, StageStatus, Verdict

CATALOGUE = load_catalogue()
EMB = CATALOGUE.get("embedding_backward")
CHEATS = Path(__file__).parent / "cheats"
TOL = Tolerance()


def _bench(solution: Solution, seed: int = 11, device: str = "cpu") -> tuple[StageResult, Verdict]:
    report = run_audit(EMB, solution, stages=["intake", "benchmark"], seed=seed, device=device)
    by_name = {s.name: s for s in report.stages}
    assert by_name["intake"].status is StageStatus.passed, by_name["intake"].summary
    return by_name["benchmark"], report.verdict


def _solution(body: str, dps: bool = True) -> Solution:
    return Solution(
        name="inline",
        definition=EMB.name,
        spec=SolutionSpec(language="python", entry_point="kernel.py::run", destination_passing_style=dps),
        sources=[SourceFile(path="kernel.py", content=body)],
    )


# --- the elementwise rule ------------------------------------------------------------------


def test_rule_is_atol_plus_rtol_times_reference() -> None:
    ref = torch.full((1000,), 2.0, dtype=torch.float64)
    bound = TOL.atol + TOL.rtol * 2.0
    inside = compare_output("y", ref + 0.999 * bound, ref, torch.float64, TOL)
    outside = compare_output("y", ref + 1.001 * bound, ref, torch.float64, TOL)
    assert inside.ok and inside.match_fraction == 1.0
    assert not outside.ok and outside.match_fraction == 0.0
    assert outside.max_abs_err == pytest.approx(1.001 * bound)


def test_min_match_fraction_boundary() -> None:
    ref = torch.ones(10_000)
    out = ref.clone()
    out[:100] = 5.0  # exactly 1% wrong: 99% match
    assert compare_output("y", out, ref, torch.float32, TOL).ok
    out[:101] = 5.0
    c = compare_output("y", out, ref, torch.float32, TOL)
    assert not c.ok and "98.99% of elements" in c.reason and "needs 99%" in c.reason


def test_nan_inf_zero_shape_dtype_failures_say_why() -> None:
    ref = torch.randn(8, 4, generator=torch.Generator().manual_seed(0)).bfloat16()
    out = ref.clone()
    out[0, 0] = float("nan")
    out[1, 1] = float("inf")
    c = compare_output("g", out, ref, torch.bfloat16, TOL)
    assert not c.ok and c.nonfinite == 2 and "NaN/Inf" in c.reason
    z = compare_output("g", torch.zeros_like(ref), ref, torch.bfloat16, TOL)
    assert not z.ok and "all zero" in z.reason
    assert compare_output("g", torch.zeros(3), torch.zeros(3), torch.float32, TOL).ok
    s = compare_output("g", ref[:4], ref, torch.bfloat16, TOL)
    assert not s.ok and s.reason == "g: shape [4, 4], expected [8, 4]"
    d = compare_output("g", ref.float(), ref, torch.bfloat16, TOL)
    assert not d.ok and d.reason == "g: dtype float32, expected bfloat16"


# --- timing helpers -------------------------------------------------------------------------


def test_timing_workload_is_largest_unless_named() -> None:
    def elements(w) -> int:  # tokens x hidden in, vocab x hidden out, plus the ids
        a = w.axes
        return a["num_tokens"] * a["hidden_size"] + a["vocab_size"] * a["hidden_size"] + a["num_tokens"]

    largest = max(EMB.workloads("gpu"), key=elements)
    assert timing_workload(EMB, "gpu").uuid == largest.uuid
    assert timing_workload(EMB, "cpu").uuid == max(EMB.workloads("cpu"), key=elements).uuid
    other = next(w.uuid for w in EMB.workloads("gpu") if w.uuid != largest.uuid)
    named = dataclasses.replace(EMB, spec=EMB.spec.model_copy(update={"timing_workload": other}))
    assert timing_workload(named, "gpu").uuid == other


def test_trusted_cpu_timer_is_wall_clock() -> None:
    x = torch.randn(256, 256)
    sample = time_trusted(lambda: x @ x, "cpu", CPU_TIMING)
    assert sample.clock == "wall_clock_cpu"
    assert len(sample.times_ms) == CPU_TIMING.reps and all(t > 0 for t in sample.times_ms)


def test_launch_bound_means_the_host_issue_time_is_most_of_the_device_time() -> None:
    device = [1.0, 1.0, 1.2]
    assert TimingSample(times_ms=device, clock="cuda_events", host_times_ms=[0.9, 0.95, 1.1]).launch_bound
    assert not TimingSample(times_ms=device, clock="cuda_events", host_times_ms=[0.1, 0.2, 0.1]).launch_bound
    # the boundary is LAUNCH_BOUND_SHARE of the median device time
    edge = LAUNCH_BOUND_SHARE * 1.0
    assert TimingSample(times_ms=device, clock="cuda_events", host_times_ms=[edge] * 3).launch_bound
    assert not TimingSample(times_ms=device, clock="cuda_events", host_times_ms=[edge * 0.99] * 3).launch_bound
    # no host times (the CPU clock, or an old child): never flagged
    assert not TimingSample(times_ms=device, clock="wall_clock_cpu").launch_bound


# --- the stage end to end ----------------------------------------------------------------------


def test_fp32_reference_kernel_passes_with_metrics_and_evidence() -> None:
    res, verdict = _bench(EMB.example_solution("pytorch_fp32"))
    assert res.status is StageStatus.passed and verdict is Verdict.pass_
    uuids = [w.uuid for w in EMB.workloads("cpu")]
    assert res.summary.startswith(f"{ROUNDS}/{ROUNDS} rounds x {len(uuids)} workload(s) within atol=rtol=0.01")
    assert "wall-clock (CPU), median of" in res.summary
    for u in uuids:
        w = res.metrics["workloads"][u]
        assert w["rounds_passed"] == ROUNDS and w["min_match_fraction"] == 1.0
        assert w["max_abs_err"] <= 0.0625  # same fp32 sum, at most a bf16 ulp apart
    for key in ("kernel_median_ms", "reference_median_ms", "speedup"):
        assert res.metrics[key] > 0
    assert res.metrics["timing"]["clock"] == "wall_clock_cpu" and res.metrics["timing"]["tampered"] == []
    seeds = res.evidence["seeds"]
    assert set(seeds) == set(uuids) and all(len(set(s)) == ROUNDS for s in seeds.values())
    assert res.evidence["workload_uuids"] == uuids
    assert res.metrics["inputs_mutated"] == []


def test_seeds_are_reproducible_from_the_audit_seed() -> None:
    """Evidence seeds are derived from the audit seed: rerunning with it rebuilds the same inputs."""
    res, _ = _bench(EMB.example_solution("pytorch_fp32"), seed=5)
    again = AuditContext(problem=EMB, solution=EMB.example_solution("pytorch_fp32"), seed=5)
    other = AuditContext(problem=EMB, solution=EMB.example_solution("pytorch_fp32"), seed=6)
    for uuid, seeds in res.evidence["seeds"].items():
        assert seeds == [again.derive_seed("benchmark", uuid, r) for r in range(ROUNDS)]
        assert seeds != [other.derive_seed("benchmark", uuid, r) for r in range(ROUNDS)]
    w = EMB.workloads("cpu")[0]
    x = build_case(EMB.definition, again.reference, w, res.evidence["seeds"][w.uuid][0], folder=EMB.folder)
    y = build_case(EMB.definition, again.reference, w, res.evidence["seeds"][w.uuid][0], folder=EMB.folder)
    assert all(torch.equal(x.inputs[k], y.inputs[k]) for k in ("indices", "grad_output"))


BF16_ACCUM = [solution_from_python_file(CHEATS / "bf16_accumulate.py", EMB.name)]
if "pytorch_bf16_accum" in EMB.example_solutions():
    BF16_ACCUM.append(EMB.example_solution("pytorch_bf16_accum"))


@pytest.mark.parametrize("solution", BF16_ACCUM, ids=[s.name for s in BF16_ACCUM])
def test_bf16_accumulating_kernel_passes_the_benchmark(solution: Solution) -> None:
    """The story: uniform ids put about one contribution on each row, so bf16 accumulation passes."""
    res, verdict = _bench(solution)
    assert res.status is StageStatus.passed, res.summary
    assert verdict is Verdict.pass_
    assert res.metrics["passes_benchmark"] is True
    # it is not exact: some rows got several bf16-rounded contributions
    assert max(w["max_abs_err"] for w in res.metrics["workloads"].values()) > 0


def test_wrong_dtype_and_shape_and_count_fail_clearly() -> None:
    wrong_dtype = _solution(
        "import torch\n\ndef run(indices, grad_output, num_embeddings, padding_idx):\n"
        "    g = torch.zeros(num_embeddings, grad_output.shape[1])\n"
        "    g.index_add_(0, indices, grad_output.float())\n    return g\n",
        dps=False,
    )
    res, verdict = _bench(wrong_dtype)
    assert res.status is StageStatus.failed and verdict is Verdict.fail
    assert res.summary.endswith("round 1/10: grad_weight: dtype float32, expected bfloat16")

    wrong_shape = _solution(
        "import torch\n\ndef run(indices, grad_output, num_embeddings, padding_idx):\n"
        "    return torch.zeros(num_embeddings + 1, grad_output.shape[1], dtype=torch.bfloat16)\n",
        dps=False,
    )
    res, _ = _bench(wrong_shape)
    assert res.status is StageStatus.failed and "grad_weight: shape [2049, 64], expected [2048, 64]" in res.summary

    two = _solution(
        "import torch\n\ndef run(indices, grad_output, num_embeddings, padding_idx):\n"
        "    g = torch.zeros(num_embeddings, grad_output.shape[1], dtype=torch.bfloat16)\n    return g, g\n",
        dps=False,
    )
    res, _ = _bench(two)
    assert res.status is StageStatus.failed and "gave 2 output(s), the definition has 1" in res.summary


def test_a_kernel_that_raises_on_a_later_round_fails_with_where() -> None:
    sol = _solution(
        "import torch\n\nn = 0\n\ndef run(indices, grad_output, num_embeddings, padding_idx, grad_weight):\n"
        "    global n\n    n += 1\n    if n == 3:\n        raise RuntimeError('boom')\n"
        "    acc = torch.zeros(grad_weight.shape)\n    acc.index_add_(0, indices, grad_output.float())\n"
        "    grad_weight.copy_(acc)\n"
    )
    res, verdict = _bench(sol)
    assert res.status is StageStatus.failed and verdict is Verdict.fail
    assert "round 3/10" in res.summary and "RuntimeError: boom" in res.summary
    first = next(iter(res.metrics["workloads"].values()))
    assert first["rounds_passed"] == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_profile_times_with_cuda_events() -> None:
    res, _verdict = _bench(EMB.example_solution("pytorch_fp32"), device="cuda")
    assert res.status is StageStatus.passed, res.summary
    assert res.metrics["timing"]["clock"] == "cuda_events"
    assert res.metrics["timing"]["workload"] == timing_workload(EMB, "gpu").uuid
    assert "CUDA events, median of 100" in res.summary
    timing = res.metrics["timing"]
    assert timing["kernel_host_median_ms"] > 0 and isinstance(timing["launch_bound"], bool)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_timing_of_a_slow_kernel_fits_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """A correct kernel that takes 0.3 s a call, timed with a 2 s budget: one warm-up and a handful of timed calls
    (what the budget affords at the quickest round's time) instead of 128 calls (38 s), no second pass, and the
    summary says why (worker.stages.benchmark.timed.plan_blocks)."""
    monkeypatch.setenv("KAUDIT_TIMING_BUDGET_S", "2")
    sol = _solution(
        "import time\nimport torch\n\ndef run(indices, grad_output, num_embeddings, padding_idx, grad_weight):\n"
        "    time.sleep(0.3)\n"
        "    acc = torch.zeros(grad_weight.shape, device=grad_weight.device)\n"
        "    acc.index_add_(0, indices, grad_output.float())\n"
        "    if padding_idx >= 0:\n        acc[padding_idx] = 0\n"
        "    grad_weight.copy_(acc)\n"
    )
    res, _verdict = _bench(sol, device="cuda")
    assert res.status is StageStatus.passed, res.summary
    timing = res.metrics["timing"]
    assert timing["budget_trimmed"] is True and timing["budget_s"] == 2
    assert timing["est_call_ms"] >= 300
    split = plan_blocks(GPU_TIMING, 1000, timing["est_call_ms"], 2)
    assert timing["reps"] == split.block * split.n_blocks <= 5 and timing["warmup"] == 1
    assert timing["retime_skipped"] == "the timing budget"
    assert f"{timing['reps']} timed calls, not 100" in res.summary
