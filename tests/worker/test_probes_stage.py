"""The probes stage: fp64-oracle error per reduction group vs the ideal output, and behavioural checks.

Everything runs for real: the solution in its sandbox child, the oracle in this process.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from worker.catalogue import Problem, load_catalogue
from worker.context import AuditContext
from worker.formats import Solution, solution_from_python_file
from worker.inputs import build_case
from worker.numerics.checks import ulps
from worker.numerics.dtypes import to_torch
from worker.numerics.error_metrics import OutputError, measure_output
from worker.numerics.tolerance import compare_output
from worker.problem_spec import BucketBy, OutputBudget
from worker.reference import Reference
from worker.sandbox import Sandbox
from worker.stages import probes as probes_stage
from worker.stages.result import StageResult, StageStatus

FIXTURES = Path(__file__).parent / "fixtures" / "probes"
CATALOGUE = load_catalogue()
EMB = CATALOGUE.get("embedding_backward")


@pytest.fixture(autouse=True)
def _interpret_triton(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the sandbox child's scrubbed environment passes it through
    yield


def run_probes(problem: Problem, solution: Solution, *, seed: int = 11, only: list[str] | None = None) -> StageResult:
    if only is not None:
        spec = problem.spec.model_copy(update={"probes": [p for p in problem.spec.probes if p.name in only]})
        problem = dataclasses.replace(problem, spec=spec)
    ctx = AuditContext(problem=problem, solution=solution, seed=seed)
    try:
        return probes_stage.run(ctx)
    finally:
        ctx.close()


def fixture_solution(name: str) -> Solution:
    return solution_from_python_file(FIXTURES / f"{name}.py", "embedding_backward")


def benchmark_rule_passes(problem: Problem, solution: Solution) -> list[str]:
    """The benchmark's elementwise rule on every CPU workload (uniform ids); returns the failures."""
    failures = []
    reference = Reference.of(problem.definition)
    with Sandbox("cpu") as sb:
        sb.load(solution)
        for i, w in enumerate(problem.workloads("cpu")):
            case = build_case(problem.definition, reference, w, seed=1000 + i, folder=problem.folder)
            reply = sb.request(
                "call", {"args": case.args(problem.definition), "outputs": case.output_specs(problem.definition)}
            )
            refs = reference.run(case.args(problem.definition))
            for (name, spec), out, ref in zip(problem.definition.outputs.items(), reply["outputs"], refs):
                cmp = compare_output(name, out, ref, to_torch(spec.dtype), problem.spec.tolerance)
                if not cmp.ok:
                    failures.append(f"{w.uuid}: {cmp.reason or cmp.match_fraction}")
    return failures


# --- the metric itself ----------------------------------------------------------


def test_ideal_output_scores_one_and_zero_rows_must_be_zero() -> None:
    torch.manual_seed(0)
    oracle = torch.randn(6, 32, dtype=torch.float64)
    oracle[2] = 0  # a row nothing contributes to
    budget = OutputBudget(group_dims=[0], max_ratio=4.0)
    ideal = oracle.to(torch.bfloat16)
    e = measure_output("g", ideal, oracle, torch.bfloat16, budget)
    assert e.passed and math.isclose(e.worst_ratio, 1.0) and e.zero_groups == 1 and e.zero_groups_nonzero == 0

    bad = ideal.clone()
    bad[2, 5] = 1e-30  # any non-zero in a row that must be zero
    e = measure_output("g", bad, oracle, torch.bfloat16, budget)
    assert not e.passed and e.zero_groups_nonzero == 1 and e.zero_group_examples == [[2]]

    nan = ideal.clone()
    nan[0, 0] = float("nan")
    e = measure_output("g", nan, oracle, torch.bfloat16, budget)
    assert not e.passed and e.nonfinite == 1 and math.isinf(e.worst_ratio)


def test_floor_where_the_ideal_output_is_exact() -> None:
    # a row that bf16 represents exactly: the ideal error is 0; one element one ulp off is judged
    # against 0.25 * u * ||row||, not against 0
    oracle = torch.full((1, 64), 1.0, dtype=torch.float64)
    out = oracle.to(torch.bfloat16).clone()
    out[0, 0] = 1.0 + 2.0**-7  # the next bf16 after 1.0
    e = measure_output("g", out, oracle, torch.bfloat16, OutputBudget(group_dims=[0]))
    u = 2.0**-8
    assert e.floored_groups == 1
    assert math.isclose(e.worst_ratio, (2 * u) / (0.25 * u * 8.0), rel_tol=1e-6)  # 1 ulp = 2u at 1.0; ||row|| = 8


def test_index_count_buckets_and_reduction_groups() -> None:
    oracle = torch.randn(4, 16, dtype=torch.float64)
    labels = torch.tensor([0, 1, 9, 600])
    oracle[0] = 0
    out = oracle.to(torch.bfloat16)
    e: OutputError = measure_output(
        "g",
        out,
        oracle,
        torch.bfloat16,
        OutputBudget(group_dims=[0], bucket_by=BucketBy(kind="index_count", input="i")),
        labels=labels,
        bucket_kind="index_count:i",
    )
    assert [b.label for b in e.buckets] == ["0", "1", "8-63", ">=512"]
    assert [b.groups for b in e.buckets] == [0, 1, 1, 1] and e.buckets[0].zero_groups == 1
    whole = measure_output("g", out, oracle, torch.bfloat16, OutputBudget(group_dims=[]))
    assert whole.groups == 1 and whole.worst_group == []


def test_ulps_counts_units_in_the_last_place() -> None:
    a = torch.tensor([1.0, 1e-3, -3.0, float("nan")], dtype=torch.bfloat16)
    b = a.clone()
    for _ in range(3):  # step bf16 bit patterns: +1 in the integer view is one ulp away from zero
        b = (b.view(torch.int16) + 1).view(torch.bfloat16)
    d = ulps(a, b, torch.bfloat16)
    assert d[:3].tolist() == [3.0, 3.0, 3.0] and d[3] == 0


# --- the stage on the catalogue ---------------------------------------------------


def reference_examples() -> list[tuple[str, str]]:
    found = []
    for problem in CATALOGUE:
        names = problem.example_solutions()
        for candidate in ("pytorch_fp32", "pytorch"):
            if candidate in names:
                found.append((problem.name, candidate))
                break
    return found


@pytest.mark.parametrize(("problem_name", "solution_name"), reference_examples())
def test_reference_example_of_every_problem_passes_probes(problem_name: str, solution_name: str) -> None:
    problem = CATALOGUE.get(problem_name)
    if not problem.spec.probes:
        pytest.skip(f"{problem_name}: audit.json lists no probes yet")
    result = run_probes(problem, problem.example_solution(solution_name))
    assert result.status is StageStatus.passed, (result.summary, result.metrics["diagnosis"][:3])
    assert all(c["passed"] for c in result.metrics["checks"].values())
    assert set(result.metrics["checks"]) >= {"inputs_unmodified", "determinism", "outputs_written"}
    assert set(result.evidence["seeds"]) == {p.name for p in problem.spec.probes}
    if problem.spec.order_free_axis:
        assert "order_invariance" in result.metrics["checks"]
    if problem_name == "embedding_backward":
        # fp32 accumulation rounded once is the ideal output
        assert result.metrics["worst_ratio"] <= 1.05


def test_bf16_accumulator_fails_probes_with_an_accumulation_diagnosis() -> None:
    result = run_probes(EMB, EMB.example_solution("pytorch_bf16_accum"))
    assert result.status is StageStatus.failed
    first = result.metrics["diagnosis"][0]
    assert "index multiplicity" in first and "accumulation" in first and "bf16" in first, first
    probes = result.metrics["probes"]
    # realistic distributions fail; the error ratio grows with the rows' multiplicity
    for name in ("real_text", "zipf_s1.0", "zipf_s1.2", "hot_id_half"):
        out = probes[name]["outputs"]["grad_weight"]
        assert out["worst_ratio"] > 4, (name, out["worst_ratio"])
        summed = [b for b in out["buckets"] if b["lo"] >= 2 and b["groups"]]
        assert summed[-1]["ratio"] > 3 * summed[0]["ratio"], (name, summed)
    assert probes["shared_direction"]["worst_ratio"] > probes["zipf_s1.0"]["worst_ratio"]
    # uniform ids (what the benchmark draws) look far milder
    assert probes["uniform_baseline"]["worst_ratio"] < probes["zipf_s1.2"]["worst_ratio"] / 3
    assert result.metrics["checks"]["order_invariance"]["passed"] is False
    assert result.metrics["checks"]["determinism"]["passed"] is True


def test_bf16_accumulator_passes_the_benchmark_rule_on_uniform_ids() -> None:
    assert benchmark_rule_passes(EMB, EMB.example_solution("pytorch_bf16_accum")) == []


@pytest.mark.parametrize(
    ("fixture", "check", "benchmark_passes"),
    [
        ("nondeterministic", "determinism", True),
        ("unwritten_rows", "outputs_written", None),  # depends on what a fresh buffer holds
        ("sorts_inputs_in_place", "inputs_unmodified", True),
        ("split_bf16_partials", "order_invariance", True),
    ],
)
def test_behavioural_check_catches_a_probe_only_failure(
    fixture: str, check: str, benchmark_passes: bool | None
) -> None:
    solution = fixture_solution(fixture)
    result = run_probes(EMB, solution, only=["zipf_s1.2", "odd_noncontiguous"])
    assert result.status is StageStatus.failed
    checks = result.metrics["checks"]
    assert checks[check]["passed"] is False, checks
    assert checks[check]["summary"] in result.metrics["diagnosis"][:2] or any(
        d.startswith(checks[check]["summary"]) for d in result.metrics["diagnosis"][:2]
    ), result.metrics["diagnosis"]
    if fixture == "split_bf16_partials":
        # within the error budget everywhere: only the order check sees it
        assert all(p["passed"] for p in result.metrics["probes"].values()), result.metrics["probes"]
    if fixture == "sorts_inputs_in_place":
        assert set(checks[check]["mutated"]) == {"indices", "grad_output"}
    if fixture == "unwritten_rows":
        assert checks[check]["outputs"]["grad_weight"]["rows_with_unwritten"] > 0
    if benchmark_passes:
        assert benchmark_rule_passes(EMB, solution) == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(("solution_name", "passes"), [("triton_fp32", True), ("triton_bf16_atomic", False)])
def test_gpu_profile_separates_fp32_atomics_from_bf16_atomics(
    solution_name: str, passes: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    ctx = AuditContext(problem=EMB, solution=EMB.example_solution(solution_name), device="cuda", seed=5)
    try:
        result = probes_stage.run(ctx)
    finally:
        ctx.close()
    if passes:
        # fp32 atomics reorder sums between runs: rounding-level only, so determinism and order checks pass
        assert result.status is StageStatus.passed, (result.summary, result.metrics["diagnosis"][:3])
    else:
        assert result.status is StageStatus.failed
        assert "index multiplicity" in result.metrics["diagnosis"][0] and "bf16" in result.metrics["diagnosis"][0]
