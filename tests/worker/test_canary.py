"""The training canary (stage 5) on the CPU profile: real text, paired runs, the noise floor,
the gradient-fidelity check, and the verdicts for a correct and a bf16-accumulating kernel."""

from __future__ import annotations

import math

import pytest
import torch

from worker.canary import judge as J
from worker.canary.binding import CanaryUnsupported, bind
from worker.canary.data import draw_batches, split
from worker.canary.model import init_state
from worker.canary.profiles import CPU
from worker.canary.train import (
    capture_op_args,
    perturb_ulp,
    perturbed_kernel,
    reference_kernel,
    train,
)
from worker.catalogue import Catalogue, load_catalogue
from worker.context import AuditContext
from worker.engine import run_audit
from worker.reference import Reference
from worker.sandbox import Sandbox
from worker.stages import canary as canary_stage
from worker.stages.result import StageStatus, Verdict


@pytest.fixture(scope="module")
def catalogue() -> Catalogue:
    return load_catalogue()


def test_sites_bind_from_the_definition(catalogue: Catalogue) -> None:
    b = bind("embedding", catalogue.get("embedding_backward").definition)
    assert [s.role for s in b.inputs] == ["ids", "grad_output", "num_embeddings", "padding_idx"]
    assert [s.role for s in b.outputs] == ["grad_table"]
    if "embedding_rmsnorm_backward" in catalogue:
        fused = bind("embedding_norm", catalogue.get("embedding_rmsnorm_backward").definition)
        roles = {s.name: s.role for s in fused.inputs}
        assert roles["indices"] == "ids" and roles["grad_output"] == "grad_output" and roles["eps"] == "eps"
        assert {s.role for s in fused.outputs} == {"grad_table", "grad_norm_weight"}
    with pytest.raises(CanaryUnsupported):
        bind("loss", catalogue.get("embedding_backward").definition)


def test_perturb_moves_half_the_elements_by_one_ulp() -> None:
    t = torch.randn(4096, dtype=torch.float32).to(torch.bfloat16)
    t[:10] = 0
    u = perturb_ulp(t, torch.Generator().manual_seed(0))
    moved = u != t
    assert 0.4 < float(moved.float().mean()) < 0.6
    spacing = torch.finfo(torch.bfloat16).eps * t.float().abs()  # one ulp is within [eps/2, eps] x |x|
    diff = (u.float() - t.float()).abs()
    assert bool((diff[moved] <= spacing[moved] + 1e-38).all())
    assert bool((diff[moved] >= spacing[moved] / 2 - 1e-38).all())
    assert bool((u[:10] >= 0).all())  # zeros only move up, never to -0/NaN bit patterns


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_perturb_leaves_infinities_and_nans_and_moves_up_and_down_equally(dtype: torch.dtype) -> None:
    special = torch.tensor([math.inf, -math.inf, math.nan], dtype=dtype).repeat(1000)
    normal = torch.randn(30_000, dtype=torch.float64).to(dtype)
    u = perturb_ulp(torch.cat([special, normal]), torch.Generator().manual_seed(3))
    s, v = u[: special.numel()], u[special.numel() :]
    assert torch.equal(s[0::3], special[0::3]) and torch.equal(s[1::3], special[1::3]) and bool(s[2::3].isnan().all())
    up, down = float((v.abs() > normal.abs()).double().mean()), float((v.abs() < normal.abs()).double().mean())
    assert 0.23 < up < 0.27 and 0.23 < down < 0.27


def test_same_seed_same_batches_reference_is_deterministic_and_the_null_is_small(catalogue: Catalogue) -> None:
    problem = catalogue.get("embedding_backward")
    p = CPU.model_copy(update={"steps": 12, "checkpoints": (6, 12)})
    b = bind("embedding", problem.definition)
    ref = reference_kernel(Reference.of(problem.definition).run_fn)
    train_ids, held_ids = split(p.vocab_size, p.heldout_fraction)
    assert len(set(train_ids[-50:].tolist())) > 10 and len(held_ids) > 10_000
    batches = draw_batches(train_ids, p.steps, p.batch_size, p.seq_len, seed=3)
    assert torch.equal(batches, draw_batches(train_ids, p.steps, p.batch_size, p.seq_len, seed=3))
    init = init_state(p, "embedding", 3)
    a = train(p, b, ref, init, batches, "sgd", "cpu")
    again = train(p, b, ref, init, batches, "sgd", "cpu")
    nudged = train(p, b, perturbed_kernel(ref, 11, "cpu"), init, batches, "sgd", "cpu")
    assert a.losses == again.losses
    assert a.losses[-1] < a.losses[0] - 0.5  # it learns
    gap = max(abs(x - y) for x, y in zip(a.losses, nudged.losses))
    assert 0 < gap < 0.05


def test_gradient_fidelity_on_real_text_separates_bf16_accumulation(catalogue: Catalogue) -> None:
    """The op's real arguments at one step: the bf16 accumulator is far off on hot rows, fp32 is not."""
    problem = catalogue.get("embedding_backward")
    p = CPU
    b = bind("embedding", problem.definition)
    ref = reference_kernel(Reference.of(problem.definition).run_fn)
    train_ids, _ = split(p.vocab_size, p.heldout_fraction)
    batch = draw_batches(train_ids, 1, p.batch_size, p.seq_len, seed=5)[0]
    (args,) = capture_op_args(p, b, ref, init_state(p, "embedding", 5), batch, "cpu", limit=1)
    counts = torch.bincount(args[0], minlength=p.vocab_size)
    assert int(counts.max()) >= 64  # real text: hot tokens
    exact = problem.oracle()(*args)[0]
    budget = problem.spec.budgets["grad_weight"]
    ratios = {}
    with Sandbox("cpu") as sbx:
        for name in ("pytorch_fp32", "pytorch_bf16_accum"):
            sbx.load(problem.example_solution(name))
            out = sbx.request(
                "call", {"args": args, "outputs": [{"shape": [p.vocab_size, p.d_model], "dtype": "bfloat16"}]}
            )["outputs"][0]
            fid = J.fidelity(0, "grad_weight", out, exact, budget, counts)
            ratios[name] = {f.bucket: f.ratio for f in fid}
    assert max(ratios["pytorch_fp32"].values()) < 1.5
    hot = [k for k in ratios["pytorch_bf16_accum"] if k.startswith(("64", "512"))]
    assert hot and max(ratios["pytorch_bf16_accum"][k] for k in hot) > budget.max_ratio
    assert ratios["pytorch_bf16_accum"]["1"] <= 1.0  # one contribution: nothing to accumulate, no error


def test_loss_rule_is_one_sided_against_the_null_band() -> None:
    steps = [10, 20]
    ref = [5.0, 4.0]
    nulls = [[5.01, 4.0], [4.99, 4.0]]
    worse = J.judge_loss("sgd", steps, ref, [5.2, 4.2], nulls, band_factor=3.0, loss_floor=0.001)
    better = J.judge_loss("sgd", steps, ref, [4.8, 3.8], nulls, band_factor=3.0, loss_floor=0.001)
    noise = J.judge_loss("sgd", steps, ref, [5.01, 4.01], nulls, band_factor=3.0, loss_floor=0.001)
    diverged = J.judge_loss("sgd", steps, ref, [5.0, math.inf], nulls, band_factor=3.0, loss_floor=0.001)
    assert worse.band == pytest.approx(0.005) and worse.threshold == pytest.approx(0.015)
    assert worse.exceeded and not better.exceeded and not noise.exceeded and diverged.exceeded


@pytest.mark.slow
def test_canary_passes_a_correct_kernel_through_the_engine(catalogue: Catalogue) -> None:
    problem = catalogue.get("embedding_backward")
    report = run_audit(problem, problem.example_solution("pytorch_fp32"), device="cpu", stages=["canary"], seed=7)
    stage = next(s for s in report.stages if s.name == "canary")
    assert stage.status is StageStatus.passed, stage.summary
    assert report.verdict is Verdict.pass_
    m, ev = stage.metrics, stage.evidence
    assert set(m["loss_gap"]) == {"sgd", "adamw"} and "rule" in m
    assert m["fidelity_worst_ratio"] < 1.5
    for opt in ("sgd", "adamw"):
        curve = ev["curves"][opt]
        assert len(curve["reference_train_loss"]) == CPU.steps
        assert len(curve["submission_train_loss_reported"]) == CPU.steps
        held = curve["heldout"]
        # every gap within the floor: the CPU profile's nulls were not needed, so not trained (test_canary_lazy_nulls)
        assert len(held["gap"]) == len(CPU.checkpoints) and held["null_gaps"] == [] and not m["nulls_trained"]
    assert {f["bucket"] for f in ev["fidelity"]} >= {"1", "2-7"}
    # the submission's training limit follows this host's measured speed, never below the profile's
    t = m["timings"]
    assert 1.0 <= t["host_slowdown"] <= 8.0
    assert t["submission_timeout_s"] == pytest.approx(CPU.child_timeout_s * t["host_slowdown"], abs=2.0)


@pytest.mark.slow
def test_canary_fails_bf16_accumulating_embedding_backward(catalogue: Catalogue) -> None:
    problem = catalogue.get("embedding_backward")
    ctx = AuditContext(problem=problem, solution=problem.example_solution("pytorch_bf16_accum"), device="cpu", seed=7)
    try:
        result = canary_stage.run(ctx)
    finally:
        ctx.close()
    assert result.status is StageStatus.failed, result.summary
    assert result.metrics["fidelity_failed"]
    assert result.metrics["fidelity_worst_ratio"] > 4.0
    assert "contributions" in result.summary
    assert any("low-precision accumulation" in d for d in result.metrics.get("diagnosis", []))


def test_canary_is_skipped_without_a_site(catalogue: Catalogue) -> None:
    # segment_mean: a scatter like the embedding's backward, but a mean per row, so it fits no site (an embedding
    # backward without audit.json's site is matched from its signature now, and trained)
    problem = catalogue.get("segment_mean")
    assert problem.spec.canary is None
    ctx = AuditContext(problem=problem, solution=problem.example_solution("pytorch_fp32"))
    assert canary_stage.run(ctx).status is StageStatus.skipped


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_canary_gives_the_memory_it_trained_with_back_to_the_card(catalogue: Catalogue) -> None:
    problem = catalogue.get("embedding_backward")
    ctx = AuditContext(problem=problem, solution=problem.example_solution("pytorch_fp32"), device="cuda", seed=3)
    torch.cuda.reset_peak_memory_stats()
    try:
        result = canary_stage.run(ctx)
    finally:
        ctx.close()
    assert result.status is StageStatus.passed, result.summary
    peak, after = torch.cuda.max_memory_reserved(), torch.cuda.memory_reserved()
    assert peak > 0 and after < 0.1 * peak, (after, peak)
