"""The add_norm site's norm-then-add (y = residual + rmsnorm(x) * weight, OLMo 2/3's post-norm block): matched from
the reference where the signature cannot tell it from add-then-norm, trained in a model whose blocks are
h = h + norm(attention(h)); h = h + norm(mlp(h)) with the kernel at both, and the residual's gradient passed straight
through (worker.canary.families.add_norm, worker.canary.forward)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.canary_support import train_with_ops
from worker.canary.arch import arch_of
from worker.canary.binding import Kernel
from worker.canary.data import draw_batches, split
from worker.canary.matching import SiteMatch, site_for
from worker.canary.model import build, init_state, param_shapes
from worker.canary.ops import Ops
from worker.canary.profiles import profile_for
from worker.canary.sites import KernelOps
from worker.canary.stacked import train_stacked
from worker.canary.train import train
from worker.catalogue import load_catalogue
from worker.formats import Definition
from worker.formats.loaders import load_definition
from worker.reference import Reference

SAMPLES = Path(__file__).resolve().parents[2] / "benchmarks" / "official_samples"
OLMO = SAMPLES / "olmo3_post_norm" / "definition.json"
STEPS = 6


def _definition() -> Definition:
    """OLMo's post-norm residual, its width left free so that the CPU's model can train it, and in fp32 (the kernel is
    called at the definition's dtypes: in bf16 an exact kernel and a bf16 add are the same)."""
    raw = json.loads(OLMO.read_text())
    raw["axes"]["hidden_size"] = {"type": "var"}
    for spec in (*raw["inputs"].values(), *raw["outputs"].values()):
        if spec["shape"] is not None:
            spec["dtype"] = "float32"
    return Definition.model_validate(raw)


def _normed(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _exact(args: list[Any], specs: list[dict[str, Any]]) -> list[torch.Tensor]:
    x, r, w, eps = args
    return [r + _normed(x, w, eps)]


def _bf16_add(args: list[Any], specs: list[dict[str, Any]]) -> list[torch.Tensor]:
    x, r, w, eps = args  # the norm exact, the residual added in bf16
    return [(r.bfloat16() + _normed(x, w, eps).bfloat16()).float()]


def _bf16_sum_of_squares(args: list[Any], specs: list[dict[str, Any]]) -> list[torch.Tensor]:
    x, r, w, eps = args  # the mean square accumulated in bf16, one column at a time (as a naive kernel's loop)
    sq = x.pow(2).bfloat16()
    acc = torch.zeros(x.shape[0], dtype=torch.bfloat16)
    for j in range(x.shape[1]):
        acc = acc + sq[:, j]
    ms = acc.float()[:, None] / x.shape[1]
    return [r + x * torch.rsqrt(ms + eps) * w]


def _norm_first_swapped(args: list[Any], specs: list[dict[str, Any]]) -> list[torch.Tensor]:
    x, r, w, eps = args  # add then norm: the op the signature alone would suggest
    return [_normed(r + x, w, eps)]


@pytest.fixture(scope="module")
def matched() -> SiteMatch:
    d = _definition()
    found = site_for(d, None, Reference.of(d).run_fn, profile_for("cpu"))
    assert found.binding is not None, found.how
    return found


def test_olmo_s_post_norm_matches_add_norm_normalising_before_it_adds(matched: SiteMatch) -> None:
    b = matched.binding
    assert b is not None and b.site == "add_norm" and b.options.norm_then_add
    assert {s.name: s.role for s in b.inputs} == {
        "sublayer_output": "x",
        "residual": "residual",
        "weight": "norm_weight",
        "eps": "eps",
    }
    assert {s.name: s.role for s in b.outputs} == {"output": "y"}
    assert "norm_then_add=True" in matched.how
    a = arch_of(b)
    assert a.norm_then_add and not a.post_norm and a.site_op == "norm_add"
    # OLMo's stream reaches the head through a final norm
    assert "final_norm" in dict(param_shapes(matched.profile, b))


def test_the_stand_in_as_written_matches_at_the_gpu_profile() -> None:
    d = load_definition(OLMO)
    found = site_for(d, None, Reference.of(d).run_fn, profile_for("gpu"))
    assert found.binding is not None and found.binding.options.norm_then_add, found.how


@pytest.mark.parametrize("problem", ["post_add_rmsnorm", "fused_add_rmsnorm", "add_rmsnorm_fp32_residual"])
def test_add_then_norm_definitions_keep_their_layout(problem: str) -> None:
    d = load_catalogue().get(problem).definition
    found = site_for(d, None, Reference.of(d).run_fn, profile_for("cpu"))
    b = found.binding
    assert b is not None and b.site == "add_norm" and not b.options.norm_then_add, found.how
    a = arch_of(b)
    assert not a.norm_then_add and a.site_op == "add_norm"
    assert a.post_norm == (b.role_out("residual") is None)  # one output: post-norm, h = norm(h + sublayer(h))


def test_nemotron_s_add_then_norm_keeps_its_layout_at_the_gpu_profile() -> None:
    d = load_definition(SAMPLES / "nemotron_rms_norm" / "definition.json")
    found = site_for(d, None, Reference.of(d).run_fn, profile_for("gpu"))
    b = found.binding
    assert b is not None and b.site == "add_norm" and not b.options.norm_then_add, found.how
    assert arch_of(b).post_norm


def _seqs(found: SiteMatch) -> torch.Tensor:
    """The canary's own training text: random tokens would leave nothing to learn."""
    p = found.profile
    return draw_batches(split(p.vocab_size, p.heldout_fraction)[0], STEPS, 4, p.seq_len, seed=0).long()


def _train(found: SiteMatch, ops: Ops) -> list[float]:
    """AdamW steps with `ops` in the model, as worker.canary.train.train takes them (which always calls a kernel)."""
    return train_with_ops(found, ops, _seqs(found), "adamw")[0]


def test_an_exact_kernel_trains_bit_for_bit_as_the_trusted_op(matched: SiteMatch) -> None:
    assert matched.binding is not None
    trusted = _train(matched, Ops())
    assert _train(matched, KernelOps(matched.binding, _exact)) == trusted
    assert trusted[-1] < trusted[0]  # it did train


@pytest.mark.parametrize("bad", [_bf16_add, _bf16_sum_of_squares, _norm_first_swapped])
def test_a_kernel_off_the_op_trains_differently(matched: SiteMatch, bad: Kernel) -> None:
    assert matched.binding is not None
    trusted = _train(matched, Ops())
    got = _train(matched, KernelOps(matched.binding, bad))
    assert got != trusted
    assert got[1:] != pytest.approx(trusted[1:], rel=1e-6, abs=0)


def test_the_kernel_is_at_both_sublayers_of_every_block(matched: SiteMatch) -> None:
    p, b = matched.profile, matched.binding
    assert b is not None
    calls: list[tuple[int, ...]] = []

    def counting(args: list[Any], specs: list[dict[str, Any]]) -> list[torch.Tensor]:
        calls.append(tuple(args[0].shape))
        return _exact(args, specs)

    model = build(p, b, init_state(p, b, 0), "cpu")
    model.loss(_seqs(matched)[0], KernelOps(b, counting)).backward()
    assert len(calls) == 2 * p.n_layers and set(calls) == {(4 * p.seq_len, p.d_model)}
    # every norm weight learns: the blocks' through the kernel's trusted backward, the final one through the head
    for name, t in model.named_parameters():
        if "norm" in name:
            assert t.grad is not None and bool(t.grad.abs().sum() > 0), name


def test_stacked_members_train_as_they_do_alone(matched: SiteMatch, one_thread: None) -> None:
    """On one thread: with two, the bf16 add turned the matmuls' last-bit difference between the stacked and the
    single model into losses 1.8e-6 apart (a CI run on two cores), beside a kernel whose own effect here is 1.4e-5."""
    p, b = matched.profile, matched.binding
    assert b is not None
    init, batches = init_state(p, b, 0), _seqs(matched)
    alone = [train(p, b, k, init, batches, "sgd", "cpu", checkpoints=()) for k in (_exact, _bf16_add)]
    together = train_stacked(p, b, [_exact, _bf16_add], init, batches, "sgd", "cpu", checkpoints=())
    for one, stacked in zip(alone, together):
        assert stacked.losses == pytest.approx(one.losses, rel=1e-6, abs=1e-6)
    assert together[0].losses != together[1].losses
