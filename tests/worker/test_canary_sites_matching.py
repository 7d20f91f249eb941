"""Where a definition's op sits in the canary's model (worker.canary.matching): matched from the signature and
confirmed by running the reference, or named in audit.json; a definition that fits no site says why; the model at a
definition's constant sizes. Fast: no sandbox, no training beyond a few steps."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from worker.canary.arch import arch_of
from worker.canary.binding import CanaryUnsupported, OpBinding
from worker.canary.data import draw_batches, split
from worker.canary.families import decode
from worker.canary.matching import SiteMatch, match, site_for
from worker.canary.model import build, init_state
from worker.canary.ops import Ops
from worker.canary.profiles import CPU, CanaryProfile
from worker.canary.sites import KernelOps
from worker.canary.stacked import train_stacked
from worker.canary.train import heldout_loss, reference_kernel, train
from worker.catalogue import Catalogue, Problem, load_catalogue
from worker.context import AuditContext
from worker.formats import Definition
from worker.problem_spec import CanarySpec
from worker.reference import Reference
from worker.stages import canary as canary_stage
from worker.stages.result import StageStatus


@pytest.fixture(scope="module", name="catalogue")
def _catalogue() -> Catalogue:
    return load_catalogue()


def _match(d: Definition, named: str | None = None, p: CanaryProfile = CPU) -> SiteMatch:
    return site_for(d, named, Reference.of(d).run_fn, p)


def _definition(
    name: str, axes: dict[str, Any], inputs: dict[str, Any], outputs: dict[str, Any], reference: str
) -> Definition:
    def spec(v: Any) -> dict[str, Any]:
        shape, dtype = v
        return {"shape": shape, "dtype": dtype}

    return Definition.model_validate(
        {
            "name": name,
            "axes": {k: ({"type": "var"} if v is None else {"type": "const", "value": v}) for k, v in axes.items()},
            "inputs": {k: spec(v) for k, v in inputs.items()},
            "outputs": {k: spec(v) for k, v in outputs.items()},
            "reference": reference,
        }
    )


# problem -> (site, options that must hold) for every catalogue definition the newer sites take
MATCHED = {
    "linear_forward": ("linear", {"act": "none"}),
    "linear_backward": ("linear", {"act": "none"}),
    "gemm_bias_gelu": ("linear", {"act": "gelu"}),
    "swiglu": ("glu", {"act": "silu"}),
    "geglu": ("glu", {"act": "gelu_tanh"}),
    "swiglu_gate_up": ("glu", {"act": "silu"}),
    "fused_add_rmsnorm": ("add_norm", {}),
    "add_rmsnorm_fp32_residual": ("add_norm", {}),
    "post_add_rmsnorm": ("add_norm", {}),
    "softmax": ("softmax", {}),
    "attention_softmax": ("softmax", {}),
    "rope": ("rope", {"rope_layout": "neox", "rope_theta": None}),
    "attention_forward": ("attention", {"heads_first": True}),
    "moe_topk_routing": ("moe_routing", {"moe_renorm": True}),
    "attention_decode_gqa": ("attention_decode", {"heads_first": False}),
    "log_softmax": ("loss", {"log_probs": True}),
    "layernorm_forward": ("norm", {"layer_norm": True}),
}
# the model at a definition's sizes, where it is not the CPU profile's own: a RoPE whose k has a head axis of its own
# trains grouped-query attention; the decode definition fixes 4 query heads, 2 key/value heads and head_dim 32, and
# its site trains 128-token sequences (worker.canary.families.decode.MIN_SEQ_LEN), 8 a batch
SIZED = {
    "rope": {"n_kv_heads": 2},
    # twice the CPU profile's width: AdamW at half its rate (worker.canary.sizing)
    "attention_decode_gqa": {
        "n_heads": 4,
        "n_kv_heads": 2,
        "d_model": 128,
        "seq_len": 128,
        "batch_size": 8,
        "adamw_lr": CPU.adamw_lr * CPU.d_model / 128,
    },
}
NO_SITE = (
    "cumsum",
    "quantize_fp8_per_token",
    "segment_mean",
    "top_k_renorm_probs",
)


@pytest.mark.parametrize("name", sorted(MATCHED))
def test_catalogue_definitions_match_their_site_from_the_signature(catalogue: Catalogue, name: str) -> None:
    problem = catalogue.get(name)
    assert problem.spec.canary is None  # nothing named: the signature and the reference decide
    found = _match(problem.definition)
    site, options = MATCHED[name]
    assert found.binding is not None, found.how
    assert found.binding.site == site and f"matched site '{site}' from the signature" in found.how
    assert {k: getattr(found.binding.options, k) for k in options} == options
    assert found.profile == CPU.model_copy(update=SIZED.get(name, {}))


def test_the_binding_says_which_model_each_site_trains(catalogue: Catalogue) -> None:
    def arch(name: str) -> Any:
        b = _match(catalogue.get(name).definition).binding  # audit.json set aside: matched from the signature
        assert b is not None
        return arch_of(b)

    assert arch("linear_forward").linear_at == "fc2" and arch("linear_backward").linear_at == "fc2"
    assert arch("gemm_bias_gelu").linear_at == "fc1" and arch("gemm_bias_gelu").mlp_bias
    assert arch("swiglu").mlp == "glu" and arch("geglu").act == "gelu_tanh"
    assert not arch("fused_add_rmsnorm").post_norm and arch("post_add_rmsnorm").post_norm
    assert arch("softmax").attention == "softmax" and arch("softmax").rope is None and arch("rope").rope == "neox"
    assert arch("moe_topk_routing").mlp == "moe" and arch("moe_topk_routing").moe_renorm
    assert arch("rmsnorm_forward") == arch("rmsnorm_backward") == arch_of("norm")  # the original model
    assert arch("embedding_backward") == arch_of("embedding") and arch("cross_entropy") == arch_of("loss")
    assert arch("log_softmax") == arch_of("loss")  # the log-probabilities of the same model's loss
    assert arch("embedding_rmsnorm_backward").emb_norm  # a norm right after the embedding
    assert all(arch(n).mlp != "moe" for n in MATCHED if n != "moe_topk_routing")


@pytest.mark.parametrize("name", NO_SITE)
def test_definitions_that_fit_no_site_say_why_for_each_site(catalogue: Catalogue, name: str) -> None:
    found = _match(catalogue.get(name).definition)
    assert found.binding is None
    assert found.how.startswith("fits no canary site (")
    for site in (
        "linear:",
        "glu:",
        "add_norm:",
        "softmax:",
        "rope:",
        "attention:",
        "attention_decode:",
        "moe_routing:",
        "norm:",
        "embedding_norm:",
        "embedding:",
        "loss:",
    ):
        assert site in found.how


# problem -> its original site and the roles of its inputs and outputs (curated: audit.json names the site)
ORIGINAL = {
    "rmsnorm_forward": ("norm", ["x", "norm_weight", "eps"], ["y"]),
    "rmsnorm_backward": ("norm", ["x", "norm_weight", "grad_output", "eps"], ["grad_x", "grad_norm_weight"]),
    "embedding_backward": ("embedding", ["ids", "grad_output", "num_embeddings", "padding_idx"], ["grad_table"]),
    "embedding_rmsnorm_backward": (
        "embedding_norm",
        ["ids", "table", "norm_weight", "grad_output", "eps"],
        ["grad_table", "grad_norm_weight"],
    ),
    "cross_entropy": ("loss", ["logits", "targets", "ignore_index"], ["loss", "grad_logits"]),
}


@pytest.mark.parametrize("name", sorted(ORIGINAL))
def test_an_original_site_s_op_matches_it_from_the_signature_as_audit_json_would_name_it(
    catalogue: Catalogue, name: str
) -> None:
    """With audit.json set aside (an uncurated definition) the signature and the reference find the original site,
    with the binding a curated audit.json naming it gives: the model trains the same either way."""
    problem = catalogue.get(name)
    site, ins, outs = ORIGINAL[name]
    assert problem.spec.canary is not None and problem.spec.canary.site == site
    found = _match(problem.definition)
    assert found.binding is not None, found.how
    assert found.binding.site == site and found.how.startswith(f"matched site '{site}' from the signature")
    assert "the reference agrees with the site's op on an example" in found.how
    assert [s.role for s in found.binding.inputs] == ins and [s.role for s in found.binding.outputs] == outs
    assert found.binding == _match(problem.definition, site).binding and found.profile == CPU


def test_the_norm_site_tells_a_layernorm_from_an_rmsnorm_and_refuses_near_misses(catalogue: Catalogue) -> None:
    """A weight and a bias make a LayerNorm at the norm site (its model's norms LayerNorms); one whose reference drops
    the bias, or is an RMSNorm with a bias added, computes another op. A bias-free LayerNorm and an RMSNorm that adds
    eps to the root (x / (sqrt(mean(x^2)) + eps): far off where the mean square is below eps) have an RMSNorm's
    signature, and running their references shows they compute another op."""
    ln = catalogue.get("layernorm_forward").definition
    found = _match(ln)
    rms = _match(catalogue.get("rmsnorm_forward").definition).binding
    assert found.binding is not None and found.binding.options.layer_norm and rms is not None
    assert arch_of(found.binding).norm == "layer" and arch_of(rms).norm == "rms"
    for body in ("bias.float()", "None"), ("bias.float()", "bias.float() * 0"):
        off = _match(ln.model_copy(update={"reference": ln.reference.replace(*body)}))
        assert off.binding is None and "norm: the reference does not compute the site's op" in off.how
    rms_bias = ln.reference.replace(
        "torch.nn.functional.layer_norm(x, (x.shape[-1],), weight.float(), bias.float(), eps)",
        "x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float() + bias.float()",
    )
    assert rms_bias != ln.reference
    off = _match(ln.model_copy(update={"reference": rms_bias}))
    assert off.binding is None and "norm: the reference does not compute the site's op" in off.how

    def rms_like(name: str, y: str) -> Definition:
        return _definition(
            name,
            {"t": None, "h": None},
            {"x": (["t", "h"], "bfloat16"), "w": (["h"], "bfloat16"), "eps": (None, "float32")},
            {"y": (["t", "h"], "bfloat16")},
            f"import torch\n\ndef run(x, w, eps):\n    x = x.float()\n    return ({y}).to(torch.bfloat16)\n",
        )

    ms = "x.pow(2).mean(-1, keepdim=True)"
    assert _match(rms_like("rms", f"x * torch.rsqrt({ms} + eps) * w.float()")).binding is not None
    for refused in (
        rms_like("rms_eps_outside", f"x / (torch.sqrt({ms}) + eps) * w.float()"),
        rms_like("layernorm_no_bias", "torch.nn.functional.layer_norm(x, x.shape[-1:], w.float(), None, eps)"),
    ):
        found = _match(refused)
        assert found.binding is None and "norm: the reference does not compute the site's op" in found.how


def test_a_layernorm_model_is_evaluated_with_the_norms_it_trained_with(catalogue: Catalogue) -> None:
    """The held-out loss is a trusted evaluation with plain ops; for a LayerNorm binding the model's norms must stay
    LayerNorms there, as in training with the reference kernel. Token embeddings on an offset (every row's mean far
    from zero) are where an RMSNorm in their place would give another loss."""
    d = catalogue.get("layernorm_forward").definition
    b = _match(d).binding
    assert b is not None
    state = init_state(CPU, b, 1)
    state["tok_emb"] = state["tok_emb"] + 0.05
    heldout = draw_batches(split(CPU.vocab_size, CPU.heldout_fraction)[1], 1, 8, CPU.seq_len, seed=2)[0]
    with torch.no_grad():
        trained_as = build(CPU, b, state, "cpu").loss(
            heldout.long(), KernelOps(b, reference_kernel(Reference.of(d).run_fn))
        )
        as_rmsnorm = build(CPU, "norm", state, "cpu").loss(heldout.long(), Ops())
    evaluated = heldout_loss(CPU, b, state, heldout, "cpu")
    assert evaluated == pytest.approx(float(trained_as), rel=1e-3)
    assert abs(float(as_rmsnorm) - evaluated) > 100 * abs(float(trained_as) - evaluated)


def _table_grad(name: str, body: str) -> Definition:
    """An embedding backward's signature; `body` fills grad [num_embeddings, hidden] from indices and grad_output."""
    return _definition(
        name,
        {"t": None, "v": None, "h": None},
        {"indices": (["t"], "int64"), "grad_output": (["t", "h"], "bfloat16"), "num_embeddings": (None, "int64")},
        {"grad_weight": (["v", "h"], "bfloat16")},
        "import torch\n\ndef run(indices, grad_output, num_embeddings):\n"
        "    grad = torch.zeros(num_embeddings, grad_output.shape[1])\n"
        f"    {body}\n"
        "    return grad.to(torch.bfloat16)\n",
    )


def test_the_embedding_sites_refuse_a_lookup_and_a_scatter_that_does_not_add_per_row(catalogue: Catalogue) -> None:
    """An embedding's forward (table[ids], a row per token) is no table gradient, at either embedding site. A
    scatter that writes each token's row instead of adding it, a mean per id (segment_mean's op under the
    embedding's names) and a padding row left with its tokens' gradient have the site's signature; the example's ids
    repeat and one of them is the padding row, so running their references shows they compute another op."""
    lookup = _definition(
        "embedding_forward",
        {"t": None, "v": None, "h": None},
        {"indices": (["t"], "int64"), "weight": (["v", "h"], "bfloat16")},
        {"output": (["t", "h"], "bfloat16")},
        "import torch\n\ndef run(indices, weight):\n    return weight[indices]\n",
    )
    how = _match(lookup).how
    assert "embedding: output holds a table's row per token id ([t, ...]): a lookup, the embedding's forward" in how
    assert "embedding_norm: output holds a table's row per token id" in how
    added = _table_grad("table_grad", "grad.index_add_(0, indices, grad_output.float())")
    assert _match(added).binding is not None
    d = catalogue.get("embedding_backward").definition
    no_padding = d.model_copy(update={"reference": d.reference.replace("grad[padding_idx] = 0", "pass")})
    for refused in (
        _table_grad("table_grad_written", "grad[indices] = grad_output.float()"),
        _table_grad(
            "table_grad_mean",
            "grad.index_add_(0, indices, grad_output.float())\n"
            "    grad /= torch.bincount(indices, minlength=num_embeddings).clamp(min=1)[:, None]",
        ),
        no_padding,
    ):
        found = _match(refused)
        assert found.binding is None and "embedding: the reference does not compute the site's op" in found.how


def test_the_loss_site_refuses_a_sum_and_a_mean_that_counts_ignored_tokens(catalogue: Catalogue) -> None:
    """The site trains the mean cross entropy of the tokens not ignored: a reference that sums, or divides by every
    token (ignored ones too: some of the example's targets are ignore_index), computes another op."""
    d = catalogue.get("cross_entropy").definition
    summed = d.reference.replace(" / count", "")
    every = d.reference.replace("valid.sum().clamp(min=1)", "torch.tensor(targets.numel())")
    assert summed != d.reference and every != d.reference
    for ref in (summed, every):
        found = _match(d.model_copy(update={"reference": ref}))
        assert found.binding is None and "loss: the reference does not compute the site's op" in found.how


def test_a_log_softmax_trains_the_loss_and_its_gradient_from_the_kernel_s_log_probabilities(
    catalogue: Catalogue,
) -> None:
    """The loss site's log-softmax: with the reference as the kernel, the model's loss and the logits' gradient are
    the cross entropy's; log-probabilities all shifted by a row's constant (a log of a sum off by its rounding) move
    the gradient too, since the trusted backward takes the softmax from the kernel's output. A reference that scales
    the log-probabilities is refused."""
    d = catalogue.get("log_softmax").definition
    b = _match(d).binding
    assert b is not None and b.site == "loss" and b.options.log_probs
    ref = reference_kernel(Reference.of(d).run_fn)

    def shifted(args: list[Any], specs: list[dict[str, Any]]) -> list[torch.Tensor]:
        return [ref(args, specs)[0] - 0.01]

    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(64, 512, generator=gen) * 3).bfloat16().float()
    targets = torch.randint(0, 512, (64,), generator=gen)
    want_logits = logits.clone().requires_grad_(True)
    want = torch.nn.functional.cross_entropy(want_logits, targets)
    want.backward()
    grads = {}
    for name, kernel in (("ref", ref), ("shifted", shifted)):
        x = logits.clone().requires_grad_(True)
        loss = KernelOps(b, kernel).loss(x, targets)
        loss.backward()
        grads[name] = (float(loss.detach()), x.grad)
    assert grads["ref"][0] == pytest.approx(float(want.detach()), rel=1e-6)
    assert torch.allclose(grads["ref"][1], want_logits.grad, atol=1e-7)
    assert grads["shifted"][0] == pytest.approx(float(want.detach()) + 0.01, rel=1e-5)
    assert not torch.allclose(grads["shifted"][1], want_logits.grad, atol=1e-7)
    scaled = d.model_copy(update={"reference": d.reference.replace("torch.log_softmax(", "2 * torch.log_softmax(")})
    assert scaled.reference != d.reference
    found = _match(scaled)
    assert found.binding is None and "loss: the reference does not compute the site's op" in found.how


@pytest.mark.parametrize("name", ["linear_forward", "linear_backward"])
def test_a_linear_site_trains_under_bf16_autocast_with_its_kernel_run_as_written(
    catalogue: Catalogue, name: str
) -> None:
    """A GPU canary trains in bf16 autocast, where the down-projection's input is a bf16 activation and its weight an
    fp32 parameter. The trusted backward must run in the forward's autocast (outside it, the two dtypes do not
    multiply: every GPU canary of a forward GEMM ended in an error), and the kernel itself outside autocast, as its
    definition's dtypes say. The CPU's autocast stands in for the GPU's."""
    d = catalogue.get(name).definition
    b = _match(d).binding
    assert b is not None and b.site == "linear"
    ref = reference_kernel(Reference.of(d).run_fn)
    autocast_seen: list[bool] = []

    def kernel(args: list[Any], specs: list[dict[str, Any]]) -> list[torch.Tensor]:
        autocast_seen.append(torch.is_autocast_enabled("cpu"))
        return ref(args, specs)

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 32, generator=gen).requires_grad_(True)
    w_in = (torch.randn(256, 32, generator=gen) * 0.1).requires_grad_(True)
    w_out = (torch.randn(64, 256, generator=gen) * 0.1).requires_grad_(True)
    grads = []
    for ops in (Ops(), KernelOps(b, kernel)):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = ops.linear(Ops().linear(x, w_in, None, "gelu"), w_out, None, "none")
        grads.append(torch.autograd.grad(y.float().square().sum(), (x, w_out)))
    assert autocast_seen == [False]
    for got, want in zip(grads[1], grads[0]):
        assert got.dtype == want.dtype and bool(torch.isfinite(got).all())
        assert float((got - want).norm() / want.norm()) < 0.05  # the same backward, the forward's output in fp32


def test_a_signature_that_fits_is_still_refused_when_the_reference_computes_another_op(catalogue: Catalogue) -> None:
    """log_softmax has a softmax's signature; running its reference shows it is not one (the loss site takes it)."""
    d = catalogue.get("log_softmax").definition
    how = match(d, Reference.of(d).run_fn, CPU, sites=("softmax",)).how
    assert "softmax: the reference does not compute the site's op" in how
    doubled = _definition(
        "gemm_scaled",
        {"m": None, "k": None, "n": None},
        {"input": (["m", "k"], "bfloat16"), "weight": (["n", "k"], "bfloat16")},
        {"output": (["m", "n"], "bfloat16")},
        "import torch\n\ndef run(input, weight):\n    return (2 * (input.float() @ weight.float().t())).to(torch.bfloat16)\n",
    )
    found = _match(doubled)
    assert found.binding is None and "linear: the reference does not compute the site's op" in found.how


def test_sites_named_in_audit_json_and_none(catalogue: Catalogue) -> None:
    rms = catalogue.get("rmsnorm_forward")
    named = _match(rms.definition, "norm")
    # a curated folder naming 'norm' is bound by its input roles alone, the reference not re-checked: no "; matched ..."
    assert named.binding is not None and named.binding.site == "norm" and named.how == "audit.json names site 'norm'"
    assert _match(catalogue.get("softmax").definition, "none").binding is None
    newer = _match(catalogue.get("softmax").definition, "softmax")
    assert newer.binding is not None and newer.how.startswith("audit.json names site 'softmax'; matched")
    with pytest.raises(CanaryUnsupported, match=r"named in audit\.json"):
        _match(catalogue.get("cumsum").definition, "softmax")


def test_layouts_the_signature_cannot_tell_are_read_from_the_reference() -> None:
    gptj = _definition(
        "rope_gptj",
        {"n": None, "h": None, "d": None},
        {"q": (["n", "h", "d"], "float32"), "k": (["n", "h", "d"], "float32"), "pos": (["n"], "int64")},
        {"q_out": (["n", "h", "d"], "float32"), "k_out": (["n", "h", "d"], "float32")},
        "import torch\n\n"
        "def _rot(x, pos):\n"
        "    d = x.shape[-1]\n"
        "    inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))\n"
        "    a = pos.double()[:, None, None] * inv\n"
        "    x1, x2 = x.double()[..., 0::2], x.double()[..., 1::2]\n"
        "    c, s = torch.cos(a), torch.sin(a)\n"
        "    return torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], -1).flatten(-2).float()\n\n"
        "def run(q, k, pos):\n    return _rot(q, pos), _rot(k, pos)\n",
    )
    found = _match(gptj)
    assert found.binding is not None and found.binding.options.rope_layout == "interleaved"
    assert found.binding.options.rope_theta == 1e6  # no theta input: the reference's own, read from what it computes
    up_gate = _definition(
        "silu_and_mul_up_first",
        {"n": None, "two_i": None, "i": None},
        {"x": (["n", "two_i"], "bfloat16")},
        {"out": (["n", "i"], "bfloat16")},
        "import torch\n\ndef run(x):\n    up, gate = x.float().chunk(2, dim=-1)\n"
        "    return (torch.nn.functional.silu(gate) * up).to(torch.bfloat16)\n",
    )
    found = _match(up_gate)
    assert found.binding is not None and found.binding.site == "glu" and found.binding.options.gate_first is False
    x_at_w = _definition(
        "matmul_kn",
        {"m": None, "k": None, "n": None},
        {"a": (["m", "k"], "float32"), "b": (["k", "n"], "float32")},
        {"c": (["m", "n"], "float32")},
        "import torch\n\ndef run(a, b):\n    return a @ b\n",
    )
    found = _match(x_at_w)
    assert found.binding is not None and found.binding.site == "linear" and found.binding.options.weight_in_out


def test_an_attention_with_tokens_before_heads_and_its_own_kv_heads() -> None:
    """[batch, tokens, heads, head_dim] with fewer key/value heads: the layout is read from the reference, and the
    model gets grouped-query attention."""
    d = _definition(
        "gqa_bthd",
        {"b": None, "t": None, "h": None, "hkv": None, "d": None},
        {
            "q": (["b", "t", "h", "d"], "bfloat16"),
            "k": (["b", "t", "hkv", "d"], "bfloat16"),
            "v": (["b", "t", "hkv", "d"], "bfloat16"),
        },
        {"o": (["b", "t", "h", "d"], "bfloat16")},
        "import torch\n\ndef run(q, k, v):\n"
        "    q, k, v = (x.float().transpose(1, 2) for x in (q, k, v))\n"
        "    r = q.shape[1] // k.shape[1]\n"
        "    k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)\n"
        "    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)\n"
        "    return o.transpose(1, 2).to(torch.bfloat16)\n",
    )
    found = _match(d)
    assert found.binding is not None and found.binding.site == "attention"
    assert found.binding.options.heads_first is False and found.profile.kv_heads == 2
    not_causal = d.model_copy(update={"reference": d.reference.replace("is_causal=True", "is_causal=False")})
    assert "attention: the reference does not compute the site's op" in _match(not_causal).how


def test_an_moe_routing_without_renormalisation_and_with_its_own_expert_count() -> None:
    """Weights as the softmax gave them (not renormalised over the k), ids first, no k input: the layout is read from
    the reference, and the constant axes give the model 16 experts, 4 per token. A reference that takes the k
    smallest logits computes no routing."""
    d = _definition(
        "router_e16_k4",
        {"t": None, "e": 16, "k": 4},
        {"gate_logits": (["t", "e"], "float32")},
        {"expert_ids": (["t", "k"], "int32"), "expert_weights": (["t", "k"], "float32")},
        "import torch\n\ndef run(gate_logits):\n"
        "    p = torch.softmax(gate_logits.float(), dim=-1)\n"
        "    w, i = torch.topk(p, 4, dim=-1)\n"
        "    return i.int(), w\n",
    )
    found = _match(d)
    assert found.binding is not None and found.binding.site == "moe_routing", found.how
    assert found.binding.options.moe_renorm is False and arch_of(found.binding).moe_renorm is False
    assert (found.profile.n_experts, found.profile.top_k) == (16, 4)
    assert [s.role for s in found.binding.outputs] == ["ids", "weights"]
    smallest = d.model_copy(
        update={"reference": d.reference.replace("dim=-1)\n    return", "dim=-1, largest=False)\n    return")}
    )
    assert "moe_routing: the reference does not compute the site's op" in _match(smallest).how


def test_constant_axes_size_the_model_and_a_model_too_large_is_refused() -> None:
    linear = _definition(
        "linear_k128",
        {"m": None, "k": 128, "n": None},
        {"x": (["m", "k"], "bfloat16"), "w": (["n", "k"], "bfloat16")},
        {"y": (["m", "n"], "bfloat16")},
        "import torch\n\ndef run(x, w):\n    return (x.float() @ w.float().t()).to(torch.bfloat16)\n",
    )
    found = _match(linear)
    assert found.binding is not None and found.profile.d_ff == 128 and found.profile.d_model == CPU.d_model
    square = _definition(
        "proj",
        {"m": None, "h": None},
        {"x": (["m", "h"], "bfloat16"), "w": (["h", "h"], "bfloat16")},
        {"y": (["m", "h"], "bfloat16")},
        "import torch\n\ndef run(x, w):\n    return (x.float() @ w.float().t()).to(torch.bfloat16)\n",
    )
    found = _match(square)  # one axis both ways: the down-projection must be square too
    assert found.binding is not None and found.profile.d_ff == found.profile.d_model == CPU.d_model
    rope = _definition(
        "rope_h2_d48",
        {"n": None, "h": 2, "d": 48},
        {
            "q": (["n", "h", "d"], "bfloat16"),
            "k": (["n", "h", "d"], "bfloat16"),
            "pos": (["n"], "int64"),
            "theta": (None, "float32"),
        },
        {"q_out": (["n", "h", "d"], "bfloat16"), "k_out": (["n", "h", "d"], "bfloat16")},
        "import torch\n\ndef _r(x, pos, theta):\n    d = x.shape[-1]\n"
        "    a = pos.double()[:, None, None] / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))\n"
        "    x1, x2 = x.double()[..., : d // 2], x.double()[..., d // 2 :]\n"
        "    return torch.cat([x1 * torch.cos(a) - x2 * torch.sin(a), x2 * torch.cos(a) + x1 * torch.sin(a)], -1).to(torch.bfloat16)\n\n"
        "def run(q, k, pos, theta):\n    return _r(q, pos, theta), _r(k, pos, theta)\n",
    )
    found = _match(rope)
    assert found.binding is not None and (found.profile.n_heads, found.profile.d_model) == (2, 96)
    wide = _definition(
        "linear_4096",
        {"m": None, "k": 4096, "n": 4096},
        {"x": (["m", "k"], "bfloat16"), "w": (["n", "k"], "bfloat16")},
        {"y": (["m", "n"], "bfloat16")},
        "import torch\n\ndef run(x, w):\n    return (x.float() @ w.float().t()).to(torch.bfloat16)\n",
    )
    found = _match(wide)
    assert found.binding is None and "past the cpu profile's 1.5M" in found.how
    assert _match(wide, p=CPU.model_copy(update={"name": "gpu", "max_params": 600_000_000})).binding is not None


def test_the_stage_skips_an_op_that_fits_no_site_with_the_reasons(catalogue: Catalogue) -> None:
    problem = catalogue.get("cumsum")
    result = canary_stage.run(AuditContext(problem=problem, solution=problem.example_solution("pytorch_fp32"), seed=1))
    assert result.status is StageStatus.skipped
    assert result.summary.startswith("no canary for this op: it fits no canary site (linear: ")
    assert result.summary.endswith("this does not count against the kernel")
    named_none = Problem(
        folder=problem.folder,
        definition=catalogue.get("softmax").definition,
        workloads_gpu=(),
        workloads_cpu=(),
        spec=problem.spec.model_copy(update={"canary": CanarySpec(site="none")}),
    )
    result = canary_stage.run(
        AuditContext(problem=named_none, solution=problem.example_solution("pytorch_fp32"), seed=1)
    )
    assert result.status is StageStatus.skipped and "canary.site = none" in result.summary


# --- the model at each newer site ---------------------------------------------------------------------------

STEPS = 3
P = CPU.model_copy(update={"steps": STEPS, "checkpoints": (STEPS,)})
# calls of the site's kernel per training step of one member: forward and backward of every layer
CALLS = {
    "linear_forward": 2,
    "linear_backward": 2,
    "gemm_bias_gelu": 2,
    "swiglu_gate_up": 2,
    "swiglu": 2,
    "add_rmsnorm_fp32_residual": 4,
    "post_add_rmsnorm": 4,
    "softmax": 2,
    "rope": 2,
    "attention_forward": 2,
    "moe_topk_routing": 2,
    "attention_decode_gqa": 8,  # forward only, in 4 calls per layer (positions grouped by cache length)
    # matched from the signature (audit.json set aside): every RMSNorm of the model, 2 a layer and the final one
    "rmsnorm_forward": 5,
    "rmsnorm_backward": 5,
    # the embedding's backward (alone or with the norm after it) once a step, the loss's forward once a step
    "embedding_backward": 1,
    "embedding_rmsnorm_backward": 1,
    "cross_entropy": 1,
    "log_softmax": 1,
    # every norm of the model, a LayerNorm: 2 a layer and the final one
    "layernorm_forward": 5,
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_each_site_trains_its_kernel_in_the_model_and_stacked_runs_match_single_ones(
    catalogue: Catalogue, name: str
) -> None:
    problem = catalogue.get(name)
    found = _match(problem.definition, p=P)
    b: OpBinding | None = found.binding
    assert b is not None
    p = found.profile
    ref = reference_kernel(Reference.of(problem.definition).run_fn)
    shapes: list[list[tuple[int, ...]]] = []

    def counting(args: list[Any], specs: list[dict[str, Any]]) -> list[torch.Tensor]:
        shapes.append([tuple(s["shape"]) for s in specs])
        return ref(args, specs)

    train_ids, _ = split(P.vocab_size, P.heldout_fraction)
    batches = draw_batches(train_ids, STEPS, P.batch_size, P.seq_len, seed=3)
    init = init_state(p, b, 3)
    alone = train(p, b, counting, init, batches, "sgd", "cpu")
    (together,) = train_stacked(p, b, [ref], init, batches, "sgd", "cpu")
    assert len(shapes) == CALLS[name] * STEPS
    assert all(math.isfinite(loss) for loss in alone.losses)
    assert together.losses == pytest.approx(alone.losses, rel=1e-6, abs=1e-6)
    assert alone.losses[-1] < alone.losses[0]  # it trains
    for name_, t in together.checkpoints[STEPS].items():
        assert torch.allclose(t, alone.checkpoints[STEPS][name_], atol=1e-6), name_


TOKENS, D, F, T = P.batch_size * P.seq_len, P.d_model, P.d_ff, P.seq_len
# the output shapes of the site's first kernel call (tokens = batch x seq_len)
SHAPES = {
    "linear_forward": [(TOKENS, D)],
    "linear_backward": [(TOKENS, F), (D, F)],
    "swiglu_gate_up": [(TOKENS, F)],
    "add_rmsnorm_fp32_residual": [(TOKENS, D), (TOKENS, D)],
    "softmax": [(P.batch_size * P.n_heads * T, T)],
    "rope": [(TOKENS, P.n_heads, D // P.n_heads), (TOKENS, 2, D // P.n_heads)],  # 2 kv heads: grouped-query
    "attention_forward": [(P.batch_size, P.n_heads, T, D // P.n_heads)],
    "moe_topk_routing": [(TOKENS, P.top_k), (TOKENS, P.top_k)],
    # the longest positions first: the batch's 32 sequences x positions 48-63 as decode rows, 4 query heads of dim 32
    "attention_decode_gqa": [(P.batch_size * T // 4, 4, 32)],
    "rmsnorm_backward": [(TOKENS, D), (D,)],
    "embedding_backward": [(P.vocab_size, D)],
    "embedding_rmsnorm_backward": [(P.vocab_size, D), (D,)],
    "cross_entropy": [(), (TOKENS, P.vocab_size)],
    "log_softmax": [(TOKENS, P.vocab_size)],
    "layernorm_forward": [(TOKENS, D)],
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_site_kernels_see_the_model_s_shapes(catalogue: Catalogue, name: str) -> None:
    problem = catalogue.get(name)
    found = _match(problem.definition, p=P)
    b = found.binding
    assert b is not None
    ref = reference_kernel(Reference.of(problem.definition).run_fn)
    seen: list[list[tuple[int, ...]]] = []

    def k(args: list[Any], specs: list[dict[str, Any]]) -> list[torch.Tensor]:
        seen.append([tuple(s["shape"]) for s in specs])
        return ref(args, specs)

    one = found.profile.model_copy(update={"steps": 1, "checkpoints": (1,)})
    batch = draw_batches(split(P.vocab_size, P.heldout_fraction)[0], 1, P.batch_size, P.seq_len, seed=1)
    train(one, b, k, init_state(one, b, 1), batch, "sgd", "cpu")
    assert seen[0] == SHAPES[name]


def test_match_tries_only_the_sites_asked(catalogue: Catalogue) -> None:
    d = catalogue.get("softmax").definition
    assert match(d, Reference.of(d).run_fn, CPU, sites=("linear", "rope")).binding is None


# --- decode ------------------------------------------------------------------------------------------------------

DECODE_REF = (
    "import torch\n\ndef run(q, k_cache, v_cache, kv_lens, sm_scale):\n"
    "    n, h, d = q.shape\n"
    "    k, v = k_cache.float(), v_cache.float()\n"
    "    if HND:\n"
    "        k, v = k.transpose(1, 2), v.transpose(1, 2)\n"
    "    s, hk = k.shape[1], k.shape[2]\n"
    "    k, v = k.repeat_interleave(h // hk, dim=2), v.repeat_interleave(h // hk, dim=2)\n"
    "    scores = torch.einsum('nhd,nshd->nhs', q.float(), k) * sm_scale\n"
    "    valid = torch.arange(s)[None, :] < kv_lens.long()[:, None]\n"
    "    if MASK:\n"
    "        scores = scores.masked_fill(~valid[:, None, :], float('-inf'))\n"
    "    return torch.einsum('nhs,nshd->nhd', torch.softmax(scores, -1), v).to(torch.bfloat16)\n"
)


def _decode(hnd: bool, mask: bool = True, slots: int | None = None) -> Definition:
    cache = ["b", "hkv", "s", "d"] if hnd else ["b", "s", "hkv", "d"]
    return _definition(
        "decode_hnd" if hnd else "decode_nhd",
        {"b": None, "s": slots, "h": None, "hkv": None, "d": None},
        {
            "q": (["b", "h", "d"], "bfloat16"),
            "k_cache": (cache, "bfloat16"),
            "v_cache": (cache, "bfloat16"),
            "seq_lens": (["b"], "int32"),
            "sm_scale": (None, "float32"),
        },
        {"out": (["b", "h", "d"], "bfloat16")},
        DECODE_REF.replace("HND", str(hnd)).replace("MASK", str(mask)),
    )


def test_a_decode_attention_s_cache_layout_is_read_from_the_reference_and_prefill_is_not_taken_for_it(
    catalogue: Catalogue,
) -> None:
    for hnd in (False, True):
        found = _match(_decode(hnd))
        assert found.binding is not None and found.binding.site == "attention_decode", found.how
        assert found.binding.options.heads_first is hnd and found.profile.kv_heads == 2
    # a reference that attends to every cache slot, whatever the sequence's length, is no decode step
    unmasked = _match(_decode(False, mask=False))
    assert unmasked.binding is None and "attention_decode: the reference does not compute the site's op" in unmasked.how
    # a cache of fixed length cannot hold the canary's rows, grouped by length
    fixed = _match(_decode(False, slots=512))
    assert fixed.binding is None and "need a variable batch and cache length; ['s'] are fixed" in fixed.how
    # prefill and decode do not take each other's definitions, even when audit.json names the other site
    assert "attention: an attention takes q, k and v as 4-D tensors" in unmasked.how
    with pytest.raises(CanaryUnsupported, match=r"named in audit\.json"):
        _match(catalogue.get("attention_decode_gqa").definition, "attention")
    with pytest.raises(CanaryUnsupported, match=r"named in audit\.json"):
        _match(catalogue.get("attention_forward").definition, "attention_decode")


def test_the_decode_site_computes_causal_attention_and_a_kernel_that_reads_past_the_lengths_is_off(
    catalogue: Catalogue,
) -> None:
    """The site's decode rows (positions grouped by length, each over its sequence's prefix) give the model's causal
    attention; a kernel that ignores the lengths reads later tokens and is far off."""
    d = catalogue.get("attention_decode_gqa").definition
    found = _match(d, p=P)
    b = found.binding
    assert b is not None
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, n, 40, 32, generator=gen) for n in (4, 2, 2))
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1), is_causal=True
    )
    ref = reference_kernel(Reference.of(d).run_fn)
    got = decode.apply(b, ref, q, k, v)
    assert float((got - want).norm() / want.norm()) < 2 * 2**-8  # one bf16 rounding of the output
    unmasked = reference_kernel(Reference.of(_decode(False, mask=False)).run_fn)
    off = decode.apply(b, unmasked, q, k, v)
    assert float((off - want).norm() / want.norm()) > 0.3
    assert decode.position_groups(40) == [(30, 40), (20, 30), (10, 20), (0, 10)]
