"""The generic probes draw around a base no larger than shapes.PROBE_MAX_NUMEL input elements: the largest
workloads cut their rows, never their reduced axes, and the plan says what it cut. Each probe computes the fp64
oracle, the reference and two reordered re-runs; at a workload's full 537M elements two audits at once ran an
80 GB card out of memory (benchmarks/results/h100-2026-12-07-second)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from worker.catalogue import load_problem
from worker.formats import Definition
from worker.generic import shapes
from worker.generic.spec import derive_plan
from worker.reference import Reference

KERNELS = Path(__file__).resolve().parents[2] / "kernels"


def _definition(constraints: list[str] | None = None) -> Definition:
    return Definition.model_validate(
        {
            "name": "row_sums",
            "op_type": "reduction",
            "axes": {"rows": {"type": "var"}, "cols": {"type": "var"}},
            "constraints": constraints or [],
            "inputs": {"x": {"shape": ["rows", "cols"], "dtype": "float32"}},
            "outputs": {"y": {"shape": ["rows"], "dtype": "float32"}},
            "reference": "import torch\ndef run(x):\n    return x.sum(-1)\n",
        }
    )


def test_rows_are_halved_and_the_reduced_axis_kept() -> None:
    cut = shapes.within_numel(_definition(), {"rows": 4096, "cols": 1024}, cap=2**20, keep=("cols",))
    assert cut == {"rows": 1024, "cols": 1024}


def test_a_workload_under_the_cap_is_left_alone() -> None:
    axes = {"rows": 64, "cols": 1024}
    assert shapes.within_numel(_definition(), axes, cap=2**20, keep=("cols",)) == axes


def test_the_constraints_hold_after_the_cut() -> None:
    d = _definition(["rows >= 2048"])
    cut = shapes.within_numel(d, {"rows": 8192, "cols": 1024}, cap=2**20, keep=("cols",))
    assert cut == {"rows": 2048, "cols": 1024}  # as far as the constraint allows, over the cap
    assert shapes.satisfies(d, cut)


def test_with_only_reduced_axes_left_nothing_is_cut() -> None:
    axes = {"rows": 8, "cols": 2**22}
    assert shapes.within_numel(_definition(), axes, cap=2**20, keep=("cols",)) == axes


@pytest.mark.parametrize(
    ("problem", "reduced", "tiny"),
    [
        ("attention_softmax", "num_keys", {"num_rows": 64, "num_keys": 256}),
        ("cross_entropy", "vocab_size", {"num_tokens": 64, "vocab_size": 512}),
    ],
)
def test_the_largest_catalogue_workloads_are_probed_at_a_cut_size(
    problem: str, reduced: str, tiny: dict[str, int]
) -> None:
    p = load_problem(KERNELS / problem)
    big = p.workloads("gpu")
    # the plan reads the structure from the smallest workload: a tiny one keeps that cheap on a CI machine (the
    # real ones are 0.4-0.5 billion elements), while the median it probes around stays one of the real ones
    small = big[0].model_copy(update={"uuid": "tiny", "axes": {**big[0].axes, **tiny}})
    plan = derive_plan(p.definition, (small, *big), "gpu", seed=1, reference=Reference.of(p.definition))
    assert plan.base_workload in {w.uuid for w in big}
    base = next(w for w in big if w.uuid == plan.base_workload)
    assert shapes.numel_of(p.definition, {a: base.axes[a] for a in p.definition.var_axes}) > shapes.PROBE_MAX_NUMEL
    assert reduced in plan.structure.reduced_axes
    assert shapes.numel_of(p.definition, plan.base_axes) <= shapes.PROBE_MAX_NUMEL
    assert reduced not in plan.axes_cut and plan.axes_cut  # rows cut, the reduction's length kept
    for axis, (workload, probe) in plan.axes_cut.items():
        assert probe < workload and plan.base_axes[axis] == probe
    assert "axes_cut" in plan.report()
    assert "benchmark stage ran the full size" in next(p.why for p in plan.spec.probes if p.name == "workload_like")
    long = next(p for p in plan.spec.probes if p.name == f"long_reduction:{reduced}")
    assert long.axes[reduced] > base.axes[reduced]
    assert shapes.numel_of(p.definition, long.axes) <= shapes.PROBE_MAX_NUMEL


def test_a_workload_of_ordinary_size_keeps_its_axes() -> None:
    p = load_problem(KERNELS / "rmsnorm_forward")
    plan = derive_plan(p.definition, p.workloads("gpu"), "gpu", seed=1, reference=Reference.of(p.definition))
    assert plan.axes_cut == {} and "axes_cut" not in plan.report()


def test_a_long_reduction_from_a_base_at_the_cap_trades_rows_for_length() -> None:
    d = _definition()
    base = {"rows": 256, "cols": 4096}  # 2**20 elements: at a cap of 2**20

    long = shapes.long_axis(d, base, "cols", 4, torch.Generator().manual_seed(0), keep=("cols",), cap=2**20)
    assert long is not None and long["cols"] >= 4 * 4096
    assert shapes.numel_of(d, long) <= 2**20  # the rows gave way, not the memory


def test_a_small_base_is_not_touched_by_the_cap() -> None:
    d = _definition()
    base = {"rows": 64, "cols": 256}
    capped = shapes.long_axis(d, base, "cols", 4, torch.Generator().manual_seed(0), keep=("cols",))
    uncapped = shapes.long_axis(d, base, "cols", 4, torch.Generator().manual_seed(0), keep=("cols",), cap=2**60)
    assert capped == uncapped and capped is not None and capped["cols"] >= 1024
