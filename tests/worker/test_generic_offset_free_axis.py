"""Two generic probes for flaws the benchmark's inputs never reach, on the catalogue's own known-bad kernels.

- `large_offset:<input>`: rows of an activation on their own offset, 1e2-1e4 times their spread. A one-pass
  variance E[x^2] - E[x]^2 in fp32 (layernorm_forward/pytorch_one_pass_variance) cancels; two passes do not.
- `free_axis:<axis>`: an axis that sizes no tensor (rope's `max_position`, which bounds the positions its workload
  generator draws) drawn near 2^20. Angles position * inv_freq formed in fp32 (rope/pytorch_fp32_angles) are off by
  up to 0.03 rad there; formed in fp64 they are not.
- `large_position:<input>`: without a free axis, an integer named as positions is set near 2^20 directly.

The catalogue problems are judged with their audit.json and oracle.py set aside (Problem.as_uncurated), so the
generic path derives the probes; only the probes under test run (run_probes on the derived spec), in the sandbox.
"""

from __future__ import annotations


import pytest
import torch

from tests.solution_support import one_file_solution
from worker.catalogue import Problem, load_catalogue
from worker.context import AuditContext
from worker.engine import run_audit
from worker.formats.bundle import DefinitionBundle
from worker.generic.shapes import FREE_AXIS_TARGET, free_axes
from worker.generic.spec import LARGE_OFFSET_RATIOS, derive_plan, offset_std
from worker.probes.outcome import ProbeOutcome
from worker.reference import Reference
from worker.stages import probes as probes_stage
from worker.stages.probes.one_probe import run_probes
from worker.stages.result import StageStatus
from worker.uploaded import problem_from_bundle

CATALOGUE = load_catalogue()


def _plan(name: str, seed: int = 1):  # type: ignore[no-untyped-def]
    problem = CATALOGUE.get(name).as_uncurated()
    return derive_plan(problem.definition, problem.workloads("cpu"), "cpu", seed, Reference.of(problem.definition))


def _outcome(name: str, solution: str, probe: str, seed: int) -> ProbeOutcome:
    """The one derived probe `probe` of the uncurated `name`, run on the catalogue's example `solution`."""
    problem = CATALOGUE.get(name).as_uncurated()
    ctx = AuditContext(problem=problem, solution=problem.example_solution(solution), seed=seed)
    try:
        spec, plan = probes_stage._spec(ctx)
        assert plan is not None  # the generic path derived it
        chosen = [p for p in spec.probes if p.name == probe]
        assert chosen, f"{name}: no probe '{probe}' in {[p.name for p in spec.probes]}"
        runs = run_probes(ctx, spec.model_copy(update={"probes": chosen}), jitter=False)
    finally:
        ctx.close()
    (outcome,) = runs.outcomes
    assert outcome.not_applicable is None and outcome.input_error is None, outcome
    return outcome


def test_the_plan_offsets_activations_only() -> None:
    plan = _plan("layernorm_forward")
    probe = next(p for p in plan.spec.probes if p.name == "large_offset:input")
    gen = probe.inputs["input"]
    assert gen.kind == "offset_rows"
    assert (gen.params["min_ratio"], gen.params["max_ratio"]) == LARGE_OFFSET_RATIOS == (1e2, 1e4)
    # gamma and beta are vectors: no rows to offset
    assert not any(p.name in ("large_offset:weight", "large_offset:bias") for p in plan.spec.probes)
    assert plan.roles["input"].activation and not plan.roles["weight"].activation
    # a GEMM's weight is rank 2 but a parameter: its rows are output features, not tokens sharing a drift
    linear = _plan("linear_forward")
    names = [p.name for p in linear.spec.probes]
    assert "large_offset:input" in names and "large_offset:weight" not in names
    assert any(s.startswith("large_offset:weight: named as a parameter") for s in linear.skipped)


def test_the_plan_draws_ropes_free_axis_near_a_million() -> None:
    plan = _plan("rope")
    problem = CATALOGUE.get("rope")
    assert free_axes(problem.definition, plan.base_axes) == ["max_position"]
    drawn = {s: next(p for p in _plan("rope", s).spec.probes if p.name == "free_axis:max_position") for s in (1, 2)}
    for probe in drawn.values():
        assert 0.75 * FREE_AXIS_TARGET <= probe.axes["max_position"] <= FREE_AXIS_TARGET
        # the tensors keep the benchmark's sizes (within the jitter): only the free axis moves
        assert probe.axes["num_tokens"] <= 1.25 * plan.base_axes["num_tokens"]
    assert drawn[1].axes != drawn[2].axes  # drawn per audit seed
    # every axis of layernorm sizes a tensor: no free-axis probe, and the plan says why
    ln = _plan("layernorm_forward")
    assert not any(p.name.startswith("free_axis") for p in ln.spec.probes)
    assert "free_axis: every var axis sizes a tensor" in ln.skipped


@pytest.mark.parametrize("seed", [1, 2])
def test_large_offset_catches_the_one_pass_variance_and_passes_two_passes(seed: int) -> None:
    bad = _outcome("layernorm_forward", "pytorch_one_pass_variance", "large_offset:input", seed)
    assert not bad.passed and bad.worst_ratio > 4 * bad.outputs[0].max_ratio, bad.worst_ratio  # far over, not marginal
    good = _outcome("layernorm_forward", "pytorch_two_pass", "large_offset:input", seed)
    assert good.passed and good.worst_ratio <= 1.5, good.worst_ratio


@pytest.mark.parametrize("seed", [1, 2])
def test_free_axis_catches_fp32_rope_angles_and_passes_fp64_angles(seed: int) -> None:
    bad = _outcome("rope", "pytorch_fp32_angles", "free_axis:max_position", seed)
    assert bad.axes["max_position"] >= 0.75 * FREE_AXIS_TARGET
    assert not bad.passed and bad.worst_ratio > bad.outputs[0].max_ratio, bad.worst_ratio
    good = _outcome("rope", "pytorch_fp64_angles", "free_axis:max_position", seed)
    assert good.passed and good.worst_ratio <= 1.5, good.worst_ratio


# A phase rotation at positions start_pos + t, one rounding to bf16 as rope's: start_pos is an integer scalar, not an
# axis, so only its name says it is a position. The workloads start at 0 and 4096, where fp32 angles (off by about
# 4096 * 2^-24 rad) are far within a bf16 rounding; near 2^20 they are off by up to 0.03 rad.
PHASE = {
    "name": "phase_at_positions",
    "description": "y = x * cos((start_pos + t) * freq), freq = 10000^(-j/d), angles in fp64",
    "axes": {"n": {"type": "var"}, "d": {"type": "var"}},
    "inputs": {
        "x": {"shape": ["n", "d"], "dtype": "bfloat16"},
        "start_pos": {"shape": None, "dtype": "int64", "description": "position of the first row"},
    },
    "outputs": {"y": {"shape": ["n", "d"], "dtype": "bfloat16"}},
    "reference": (
        "import torch\n\n\ndef run(x, start_pos):\n"
        "    n, d = x.shape\n"
        "    freq = 10000.0 ** (-torch.arange(d, dtype=torch.float64) / d)\n"
        "    pos = start_pos + torch.arange(n, dtype=torch.float64)\n"
        "    return (x.double() * torch.cos(pos[:, None] * freq[None, :])).to(torch.bfloat16)\n"
    ),
}
FP64_ANGLES = PHASE["reference"]  # type: ignore[index]
FP32_ANGLES = str(FP64_ANGLES).replace("torch.float64", "torch.float32")  # the angle rounded to fp32


@pytest.fixture(scope="module")
def phase(tmp_path_factory: pytest.TempPathFactory) -> Problem:
    workloads = [
        {"uuid": f"w{i}", "axes": {"n": 64, "d": 64}, "inputs": {"start_pos": {"type": "scalar", "value": v}}}
        for i, v in enumerate((0, 4096))
    ]
    bundle = DefinitionBundle.model_validate({"definition": PHASE, "workloads": workloads})
    return problem_from_bundle(bundle, tmp_path_factory.mktemp("phase") / "uploads", trusted_reference=True)


def _phase_probes(problem: Problem, body: str) -> tuple[StageStatus, str, dict[str, object]]:
    solution = one_file_solution(problem.name, body)
    report = run_audit(problem, solution, stages=["intake", "probes"], seed=3)
    stage = next(s for s in report.stages if s.name == "probes")
    return stage.status, stage.summary, stage.metrics


def test_a_position_scalar_is_pushed_to_a_long_context(phase: Problem) -> None:
    plan = derive_plan(phase.definition, phase.workloads("cpu"), "cpu", 1, Reference.of(phase.definition))
    probe = next(p for p in plan.spec.probes if p.name == "large_position:start_pos")
    assert 0.875 * FREE_AXIS_TARGET <= probe.inputs["start_pos"].params["value"] < FREE_AXIS_TARGET
    bad_status, bad_summary, bad = _phase_probes(phase, FP32_ANGLES)
    assert bad_status is StageStatus.failed, bad_summary
    failed = [n for n, p in bad["probes"].items() if isinstance(p, dict) and p.get("passed") is False]  # type: ignore[union-attr]
    assert failed == ["large_position:start_pos"], failed  # the benchmark-like probes start at 0 and pass
    good_status, good_summary, _ = _phase_probes(phase, FP64_ANGLES)
    assert good_status is StageStatus.passed, good_summary


def test_the_offset_spread_keeps_fp8_rows_finite() -> None:
    assert offset_std(torch.bfloat16, 1e4) == 1.0 and offset_std(torch.float32, 1e4) == 1.0
    # e4m3 tops out at 448: the offset (1e4 spreads) must fit, so the spread shrinks instead
    std = offset_std(torch.float8_e4m3fn, 1e4)
    assert std * (1e4 + 8) <= 448 / 2
