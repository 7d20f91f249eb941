"""Generic probes: derived from a definition with no audit.json, against the promoted fp64 reference.

The fixture tests/worker/fixtures/generic/tiny_softmax is a definition folder with workloads and two
examples, and no audit.json or oracle.py. Everything runs for real: the kernel in its sandbox child.
"""

from __future__ import annotations

from pathlib import Path

from worker.catalogue import load_catalogue, load_problem
from worker.context import AuditContext
from worker.generic.spec import derive_plan
from worker.inputs import build_case
from worker.numerics.dtypes import to_torch
from worker.numerics.tolerance import compare_output
from worker.reference import Reference
from worker.sandbox import Sandbox
from worker.stages import probes as probes_stage
from worker.stages.result import StageStatus

TINY = load_problem(Path(__file__).parent / "fixtures" / "generic" / "tiny_softmax")


def _probes(problem, solution_name: str, seed: int = 3):  # type: ignore[no-untyped-def]
    ctx = AuditContext(problem=problem, solution=problem.example_solution(solution_name), seed=seed)
    try:
        return probes_stage.run(ctx)
    finally:
        ctx.close()


def test_plan_reads_the_reduction_axis_and_draws_axes_per_seed() -> None:
    a = derive_plan(TINY.definition, TINY.workloads("cpu"), "cpu", seed=1, reference=Reference.of(TINY.definition))
    assert a.structure.outputs["probs"].coupled == ["cols"]
    assert a.spec.budgets["probs"].group_dims == [0]  # one group per row, the axis softmax reduces over inside it
    names = [p.name for p in a.spec.probes]
    assert {
        "workload_like",
        "scale_0.0001:logits",
        "scale_1000:logits",
        "odd_shape",
        "strided",
        "long_reduction:cols",
    } <= set(names)
    assert any("no integer input" in s for s in a.skipped)
    odd = next(p for p in a.spec.probes if p.name == "odd_shape")
    assert all(v % 2 == 1 for v in odd.axes.values())
    # the axes come from the seed: the same seed draws the same, other seeds draw others
    again = derive_plan(TINY.definition, TINY.workloads("cpu"), "cpu", seed=1, reference=Reference.of(TINY.definition))
    assert [p.axes for p in again.spec.probes] == [p.axes for p in a.spec.probes]
    others = {
        tuple(sorted(p.axes.items()))
        for s in range(2, 9)
        for p in derive_plan(
            TINY.definition, TINY.workloads("cpu"), "cpu", s, Reference.of(TINY.definition)
        ).spec.probes
        if p.name == "workload_like"
    }
    assert len(others) > 1


def test_benchmark_rule_passes_the_known_bad_kernel_on_its_workloads() -> None:
    reference = Reference.of(TINY.definition)
    with Sandbox("cpu") as sb:
        sb.load(TINY.example_solution("exp_no_max"))
        for i, w in enumerate(TINY.workloads("cpu")):
            case = build_case(TINY.definition, reference, w, seed=100 + i)
            reply = sb.request(
                "call", {"args": case.args(TINY.definition), "outputs": case.output_specs(TINY.definition)}
            )
            ref = reference.run(case.args(TINY.definition))[0]
            assert compare_output("probs", reply["outputs"][0], ref, to_torch("bfloat16"), TINY.spec.tolerance).ok


def test_generic_probes_catch_the_known_bad_kernel() -> None:
    result = _probes(TINY, "exp_no_max")
    assert result.status is StageStatus.failed, result.summary
    assert result.summary.startswith("generic probes (no audit.json)")
    probes = result.metrics["probes"]
    assert probes["scale_1000:logits"]["passed"] is False
    assert probes["scale_1000:logits"]["outputs"]["probs"]["nonfinite"] > 0
    assert probes["workload_like"]["passed"] is True  # the benchmark's own distribution does not show it
    generic = result.evidence["generic"]
    assert "scale_1000:logits" in generic["applied"] and generic["plan_seed"] is not None
    assert any(s.startswith("id distributions") for s in generic["not_applied"])  # and says why
    assert result.evidence["oracle"]["precision"] == "fp64"
    assert all("axes_used" in p and "seed" in p for p in result.evidence["probes"])


def test_generic_probes_pass_the_correct_kernel() -> None:
    result = _probes(TINY, "stable")
    assert result.status is StageStatus.passed, result.summary
    assert result.metrics["worst_ratio"] <= 1.5 and "layout" not in result.metrics
    assert {c for c in result.metrics["checks"]} >= {"inputs_unmodified", "determinism", "outputs_written"}


def test_curated_spec_still_wins() -> None:
    problem = load_catalogue().get("rmsnorm_forward")
    ctx = AuditContext(problem=problem, solution=problem.example_solution("pytorch"), seed=1)
    spec, plan = probes_stage._spec(ctx)
    assert plan is None and spec is problem.spec and problem.has_oracle
    # the same folder judged as if uncurated gets a derived plan and the generic oracle
    bare = problem.as_uncurated()
    spec2, plan2 = probes_stage._spec(AuditContext(problem=bare, solution=problem.example_solution("pytorch"), seed=1))
    assert plan2 is not None and [p.name for p in spec2.probes] != [p.name for p in problem.spec.probes]
    assert not bare.has_oracle and type(bare.oracle()).__name__ == "GenericOracle"


def test_curated_probe_axes_are_drawn_per_audit_keeping_divisibility() -> None:
    problem = load_catalogue().get("rmsnorm_forward")
    odd = next(p for p in problem.spec.probes if p.name == "odd_shape")  # 1023 x 1000: must stay unaligned
    wide = next(p for p in problem.spec.probes if p.name == "wide_rows_same_sign")  # 16 x 8192: stays aligned
    drawn = {}
    for seed in range(6):
        ctx = AuditContext(problem=problem, solution=problem.example_solution("pytorch"), seed=seed)
        a, b = probes_stage._jittered(ctx, odd).axes, probes_stage._jittered(ctx, wide).axes
        assert a["num_tokens"] % 2 == 1 and a["hidden_size"] % 8 == 0 and a["hidden_size"] % 16 != 0
        assert b["hidden_size"] % 16 == 0 and 0.75 * 8192 <= b["hidden_size"] <= 1.25 * 8192
        assert b["num_tokens"] == 16  # 16 has room for no other multiple of 16 within +-25%
        drawn[seed] = (a["num_tokens"], a["hidden_size"], b["hidden_size"])
        again = AuditContext(problem=problem, solution=problem.example_solution("pytorch"), seed=seed)
        assert probes_stage._jittered(again, odd).axes == a  # reproducible from the audit seed
    assert len(set(drawn.values())) > 3


def test_canary_says_no_canary_for_an_op_that_fits_no_site() -> None:
    from worker.stages import canary as canary_stage
    from worker.stages.result import AuditReport, Verdict

    # the fixture's softmax fits the canary's softmax site (worker.canary.matching); a cumulative sum fits none
    cumsum = load_catalogue().get("cumsum")
    ctx = AuditContext(problem=cumsum.as_uncurated(), solution=cumsum.example_solution("pytorch_fp32"), seed=1)
    result = canary_stage.run(ctx)
    assert result.status is StageStatus.skipped and result.summary.startswith("no canary for this op")
    assert AuditReport.verdict_of([result]) is Verdict.pass_  # it does not count against the kernel


def test_a_kernel_assuming_contiguous_inputs_passes_with_an_advisory() -> None:
    """The benchmark's contract is contiguous tensors: the derived strided probe reports, it does not fail."""
    result = _probes(TINY, "contiguous_only")
    assert result.metrics["probes"]["strided"]["passed"] is False  # it really does read the wrong elements
    assert result.status is StageStatus.passed, result.summary
    assert result.metrics["advisories"] == ["strided"]
    assert result.metrics["layout"]["status"] == "warning" and result.metrics["layout"]["inputs"] == ["logits"]
    assert "advisory, not counted: strided" in result.summary and ".contiguous()" in result.summary
    assert result.metrics["worst_probe"] != "strided"
