"""The canary trains its null runs only when the rule needs them (CanaryProfile.lazy_nulls).

The rule fails a held-out gap above max(band_factor x null band, loss_floor): a gap at or below the floor passes
whatever the nulls say, so they are trained only where a gap exceeds it in size, after the submission's runs. Real parts
throughout: the catalogue's embedding-backward problem, kernels in their sandbox children, the stage's own
training; only the profile is shortened (20 steps)."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.canary import judge
from worker.canary.profiles import CanaryProfile, profile_for
from worker.catalogue import load_catalogue
from worker.context import AuditContext
from worker.formats import Solution
from worker.stages import canary as canary_stage
from worker.stages.canary.losses import nulls_needed
from worker.stages.result import StageResult, StageStatus

SHORT = {"steps": 20, "checkpoints": (10, 20), "fidelity_steps": (0, 20), "seed_pool": None}
LAZY = profile_for("cpu", **SHORT)
EAGER = profile_for("cpu", **SHORT, lazy_nulls=False)
PROBLEM = load_catalogue().get("embedding_backward")

# gradient ascent on the embedding: training is plainly worse, so the held-out gap exceeds the floor
ASCENT = Solution.model_validate(
    {
        "name": "ascent",
        "definition": "embedding_backward",
        "spec": {"language": "python", "entry_point": "k.py::run", "destination_passing_style": True},
        "sources": [
            {
                "path": "k.py",
                "content": (
                    "import torch\n\n"
                    "def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):\n"
                    "    acc = torch.zeros(grad_weight.shape, dtype=torch.float32, device=grad_output.device)\n"
                    "    acc.index_add_(0, indices, grad_output.float())\n"
                    "    if padding_idx >= 0:\n"
                    "        acc[padding_idx] = 0\n"
                    "    grad_weight.copy_(-4.0 * acc)\n"
                ),
            }
        ],
    }
)


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAUDIT_CACHE_DIR", str(tmp_path))


def _canary(solution: Solution, profile: CanaryProfile, seed: int = 11) -> StageResult:
    ctx = AuditContext(problem=PROBLEM, solution=solution, device="cpu", seed=seed)
    try:
        return canary_stage.run(ctx, profile)
    finally:
        ctx.close()


def test_both_profiles_train_their_nulls_lazily_and_read_the_parent_from_a_pool_of_seeds() -> None:
    # on the H200 the reference's side with its nulls (4 stacked runs) took 1.6-1.9x the time of 2
    # (benchmarks/results/h200-2026-12-03/callA_canary_step.txt)
    assert all(profile_for(name).lazy_nulls and profile_for(name).seed_pool == 4 for name in ("cpu", "gpu"))


def test_a_correct_kernel_passes_without_the_null_runs() -> None:
    result = _canary(PROBLEM.example_solution("pytorch_fp32"), LAZY)
    assert result.status is StageStatus.passed, result.summary
    m = result.metrics
    assert m["nulls_trained"] is False and m["runs"]["parent"] == 2
    assert "parent_nulls_train_s" not in m["timings"]
    assert all(abs(g) <= LAZY.loss_floor for g in m["loss_gap"].values())
    assert all(t == LAZY.loss_floor for t in m["loss_threshold"].values())
    assert "no null needed" in result.summary
    for curve in result.evidence["curves"].values():
        assert curve["heldout"]["null_gaps"] == [] and curve["null_kinds"] == []


def test_a_gap_over_the_floor_trains_the_nulls_and_judges_as_the_eager_profile_does() -> None:
    lazy = _canary(ASCENT, LAZY)
    eager = _canary(ASCENT, EAGER)
    assert lazy.metrics["nulls_trained"] is True and "parent_nulls_train_s" in lazy.metrics["timings"]
    assert lazy.metrics["runs"]["parent"] == eager.metrics["runs"]["parent"] == 4
    for opt, curve in lazy.evidence["curves"].items():
        assert len(curve["heldout"]["null_gaps"]) == LAZY.perturbed_runs + LAZY.repeat_runs
        assert curve["null_kinds"] == eager.evidence["curves"][opt]["null_kinds"]
    assert lazy.status is eager.status is StageStatus.failed, (lazy.summary, eager.summary)
    assert lazy.metrics["loss_exceeded"] == eager.metrics["loss_exceeded"]
    assert any(lazy.metrics["loss_exceeded"].values())
    assert lazy.metrics["loss_gap"] == pytest.approx(eager.metrics["loss_gap"])
    assert lazy.metrics["loss_threshold"] == pytest.approx(eager.metrics["loss_threshold"], rel=0.05)


def test_nulls_trained_after_a_cache_hit_are_stored_with_the_entry() -> None:
    pooled = profile_for("cpu", **{**SHORT, "seed_pool": 1})  # one fixed canary seed: every audit shares the entry
    first = _canary(PROBLEM.example_solution("pytorch_fp32"), pooled, seed=1)
    assert first.metrics["nulls_trained"] is False and "parent_read_from_cache" not in first.metrics["timings"]
    bad = _canary(ASCENT, pooled, seed=2)
    assert (
        bad.metrics["timings"].get("parent_read_from_cache") == 1.0 and "parent_nulls_train_s" in bad.metrics["timings"]
    )
    again = _canary(ASCENT, pooled, seed=3)
    assert again.metrics["timings"].get("parent_read_from_cache") == 1.0
    assert "parent_nulls_train_s" not in again.metrics["timings"]  # read back with the entry
    assert again.metrics["nulls_trained"] is True
    assert again.metrics["loss_threshold"] == bad.metrics["loss_threshold"]
    assert again.status is bad.status is StageStatus.failed


def _judged(gap: float, floor: float = 0.1) -> judge.LossJudgement:
    return judge.judge_loss("adamw", [10, 20], [3.0, 2.5], [3.0 + gap, 2.5 + gap], [], 3.0, floor)


@pytest.mark.parametrize(
    ("gap", "needed"),
    [
        (0.05, False),
        (-0.05, False),
        (0.15, True),  # a worse loss past the floor: the rule needs the band
        (-2.87, True),  # a better one that far (SOL-ExecBench's RMSNorm at width 4096, AdamW, H100): the band is shown
    ],
)
def test_the_nulls_are_trained_for_a_gap_past_the_floor_either_way(gap: float, needed: bool) -> None:
    lj = _judged(gap)
    assert lj.mean_gap == pytest.approx(gap)
    assert lj.exceeded is (gap > 0.1)  # the rule itself stays one-sided
    assert nulls_needed([_judged(0.0), lj], 0.1) is needed
