"""The canary stage at each newer site, on the catalogue's examples: the correct one passes, the known-bad one (an
honest numerics bug) is caught. Real in every part: the kernel trains in its sandbox child, the parent trains the
reference; the CPU profile is shortened to 40 steps (checkpoints 10, 20, 40; gradient fidelity at steps 0 and 40)
with one fixed seed, so a problem's examples share the parent's runs through the parent cache. The full profile's
numbers (gaps, noise bands, fidelity) are benchmarks/results/canary_sites_cpu.md.

- linear (worker.canary.families.linear): a GEMM in the MLP's down-projection, forward (K = d_ff = 256: a bf16
  accumulator fails) or backward (grad_weight sums 2,048 tokens: 16-token tiles accumulated in bf16 fail); GEMM + bias
  + GELU in the up-projection.
- glu: gate-up with its weights (GEMMs with bf16 running sums fail), or the activation alone after trusted projections.
- add_norm: pre-norm with the residual stream kept by the kernel (in fp32 here), or post-norm (all fp32): an add in
  bf16 fails.
- softmax: attention's scores, written out: a row sum of exps carried in bf16 fails. Not caught, and not asked: the
  example without max subtraction (this model's scores stay far below where fp32's exp overflows).
- rope: q and k at offsets up to 65,536 positions: inv_freq held in bf16 fails (already whole radians off there).
- attention: SDPA of every layer: the correct example passes. The catalogue's output accumulator in bf16 per 64-key
  block is near the ideal error at the training length (one block: 1.4x) and fails on the longer window the trained
  weights also run (CanaryProfile.fidelity_context, 8,192 tokens: 128 blocks).
- moe_routing: the router's top-k in an MoE feed-forward (8 experts, 2 per token): the softmax and top-k in the bf16
  logits' own dtype fails (weights of bf16 precision; near-tied experts swapped).
- attention_decode: causal attention as one GQA decode step per position over its sequence's KV cache (128-token
  sequences): a running P @ V rounded to bf16 per cache slot fails.
- norm, as a LayerNorm (worker.canary.families.norm): every norm of the model a LayerNorm: the two-pass one passes;
  a sum of squares carried in bf16 fails where the model is as wide as the GPU's (d_model 256; at the CPU profile's 64
  its error is 2.7x a bf16 rounding, under the limit).
- loss, as a log-softmax (worker.canary.families.loss): the model's loss and the logits' gradient from the kernel's
  log-probabilities: a running sum of exps across vocabulary chunks kept in bf16 fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from worker.canary.profiles import profile_for
from worker.catalogue import load_catalogue
from worker.context import AuditContext
from worker.formats import SourceFile
from worker.stages import canary as canary_stage
from worker.stages.result import StageResult, StageStatus

pytestmark = pytest.mark.slow  # each case trains a canary

SHORT = profile_for("cpu", steps=40, checkpoints=(10, 20, 40), fidelity_steps=(0, 40), seed_pool=1)
# (site, problem, solution, expected)
CASES = [
    ("linear", "linear_forward", "pytorch_fp32", "pass"),
    ("linear", "linear_forward", "pytorch_bf16_accumulator", "fail"),
    ("linear", "linear_backward", "pytorch_fp32", "pass"),
    ("linear", "linear_backward", "pytorch_bf16_split_tokens", "fail"),
    ("linear", "gemm_bias_gelu", "pytorch_fp32", "pass"),
    ("glu", "swiglu_gate_up", "pytorch_fp32", "pass"),
    ("glu", "swiglu_gate_up", "pytorch_bf16_accumulator", "fail"),
    ("glu", "swiglu", "pytorch_fp32", "pass"),
    ("add_norm", "add_rmsnorm_fp32_residual", "pytorch_fp32", "pass"),
    ("add_norm", "add_rmsnorm_fp32_residual", "pytorch_bf16_add", "fail"),
    ("add_norm", "post_add_rmsnorm", "pytorch_fp32", "pass"),
    ("add_norm", "post_add_rmsnorm", "pytorch_bf16_add", "fail"),
    ("softmax", "attention_softmax", "pytorch_fp32", "pass"),
    ("softmax", "attention_softmax", "pytorch_bf16_row_sum", "fail"),
    ("softmax", "softmax", "pytorch_fp32", "pass"),
    ("rope", "rope", "pytorch_fp64_angles", "pass"),
    ("rope", "rope", "pytorch_bf16_inv_freq", "fail"),
    ("attention", "attention_forward", "pytorch_fp32", "pass"),
    ("attention", "attention_forward", "pytorch_bf16_accumulator", "fail"),
    ("moe_routing", "moe_topk_routing", "pytorch_stable_sort", "pass"),
    ("moe_routing", "moe_topk_routing", "pytorch_bf16_softmax", "fail"),
    ("attention_decode", "attention_decode_gqa", "pytorch_fp32", "pass"),
    ("attention_decode", "attention_decode_gqa", "pytorch_bf16_accumulator", "fail"),
    ("loss", "log_softmax", "pytorch_logsumexp", "pass"),
    ("loss", "log_softmax", "pytorch_bf16_chunk_sum", "fail"),
    ("norm", "layernorm_forward", "pytorch_two_pass", "pass"),
]


@pytest.fixture(scope="module", autouse=True)
def parent_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One parent cache for the module: the second example of a problem reads the reference's runs back."""
    path = tmp_path_factory.mktemp("canary_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KAUDIT_CACHE_DIR", str(path))
        yield path


def _canary(problem: str, solution: str) -> StageResult:
    p = load_catalogue().get(problem)
    ctx = AuditContext(problem=p, solution=p.example_solution(solution), device="cpu", seed=1)
    try:
        return canary_stage.run(ctx, SHORT)
    finally:
        ctx.close()


@pytest.mark.parametrize(
    ("site", "problem", "solution", "expected"), CASES, ids=[f"{s}:{p}/{n}" for s, p, n, _ in CASES]
)
def test_the_canary_at_each_newer_site(site: str, problem: str, solution: str, expected: str) -> None:
    result = _canary(problem, solution)
    m = result.metrics
    assert m["site"] == site and m["site_match"].startswith(f"matched site '{site}' from the signature")
    if expected == "pass":
        assert result.status is StageStatus.passed, result.summary
        assert (
            m["fidelity_worst_ratio"] <= 4.0
        )  # ~1 for a bf16 output rounded once; ~2.6 for post_add_rmsnorm's fp32 one
        assert all(abs(g) <= SHORT.loss_floor for g in m["loss_gap"].values())
        return
    # caught by the gradient-fidelity check; the loss gap is recorded, not required: at this model size a numerics
    # bug of a few bf16 roundings rarely moves the held-out loss past the noise floor
    assert result.status is StageStatus.failed, result.summary
    assert m["fidelity_failed"] and m["fidelity_worst_ratio"] > 4.0
    assert (
        result.summary.startswith("changes training beyond rounding: the op's")
        and "x the ideal error" in result.summary
    )
    if site == "attention":  # the error the sequence's length grows: caught on the long window alone
        assert f"on a window of {SHORT.fidelity_context} tokens is" in result.summary
        assert result.evidence["long_context"].startswith(f"checked on one window of {SHORT.fidelity_context} tokens")


@pytest.mark.parametrize(
    ("problem", "bad"),
    [("embedding_backward", "pytorch_bf16_accum"), ("embedding_rmsnorm_backward", "pytorch_bf16_embed_accum")],
)
def test_an_uncurated_embedding_gradient_is_trained_and_its_bf16_accumulator_caught(problem: str, bad: str) -> None:
    """The mission's own kernel, uploaded as a bare SOL-ExecBench definition (audit.json and oracle.py set aside):
    the site comes from the signature, and the canary trains the kernel and fails the bf16 running sum."""
    p = load_catalogue().get(problem).as_uncurated()
    assert p.spec.canary is None  # nothing curated says where it trains
    results = {}
    for solution in ("pytorch_fp32", bad):
        ctx = AuditContext(problem=p, solution=p.example_solution(solution), device="cpu", seed=1)
        try:
            results[solution] = canary_stage.run(ctx, SHORT)
        finally:
            ctx.close()
    good, caught = results["pytorch_fp32"], results[bad]
    for r in (good, caught):
        assert r.metrics["site_match"].startswith("matched site '"), r.metrics["site_match"]
        assert "from the signature" in r.metrics["site_match"]
    assert good.status is StageStatus.passed, good.summary
    assert caught.status is StageStatus.failed, caught.summary
    assert caught.metrics["fidelity_failed"] and caught.metrics["fidelity_worst_ratio"] > 4.0


ZEROED_POST_NORM = """import torch


def run(input, residual, weight, eps, output):
    output.zero_()  # the layer's output lost: training cannot use it
"""


def test_a_gap_past_one_nulls_limit_is_judged_again_against_more_nulls() -> None:
    """With CanaryProfile.confirm_nulls, a gap still past the limit after the first null trains more nulls (kept in the
    parent cache, so the next audit at that seed reads them) and is judged against all; a real loss stays caught."""
    p = load_catalogue().get("post_add_rmsnorm")
    profile = SHORT.model_copy(update={"confirm_nulls": 2})
    solution = p.example_solution("pytorch_fp32").model_copy(
        update={"sources": [SourceFile(path="kernel.py", content=ZEROED_POST_NORM)]}
    )
    results = []
    for _ in range(2):
        ctx = AuditContext(problem=p, solution=solution, device="cpu", seed=1)
        try:
            results.append(canary_stage.run(ctx, profile))
        finally:
            ctx.close()
    first, again = results
    for r in results:
        assert r.status is StageStatus.failed, r.summary
        assert all(r.metrics["loss_exceeded"].values())
        assert r.metrics["runs"]["parent"] == 2 * (1 + 1 + 2)  # per optimiser: reference, first null, two more
    assert "parent_confirm_nulls_train_s" in first.metrics["timings"]
    assert "parent_confirm_nulls_train_s" not in again.metrics["timings"]  # read back with the parent's runs


def test_a_layernorm_whose_sum_of_squares_is_bf16_fails_at_the_gpu_model_s_width() -> None:
    """The LayerNorm site's known-bad kernel: its error grows with the width it sums, so the CPU profile's model is
    widened to the GPU profile's d_model (256); there it is 11x the ideal error (1.0x for the two-pass kernel)."""
    wide = SHORT.model_copy(update={"d_model": 256, "max_params": 4_000_000})
    p = load_catalogue().get("layernorm_forward")
    results = {}
    for name in ("pytorch_bf16_sum_of_squares", "pytorch_two_pass"):
        ctx = AuditContext(problem=p, solution=p.example_solution(name), device="cpu", seed=1)
        try:
            results[name] = canary_stage.run(ctx, wide)
        finally:
            ctx.close()
    bad, good = results["pytorch_bf16_sum_of_squares"], results["pytorch_two_pass"]
    assert bad.metrics["site"] == "norm" and "layer_norm=True" in bad.metrics["site_match"]
    assert bad.status is StageStatus.failed and bad.metrics["fidelity_worst_ratio"] > 4.0, bad.summary
    assert good.status is StageStatus.passed and good.metrics["fidelity_worst_ratio"] <= 4.0, good.summary
