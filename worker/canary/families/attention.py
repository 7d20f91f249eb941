"""Site "attention": causal scaled-dot-product attention, softmax(q k^T * scale + causal mask) v, of every layer.

Signatures: q, k, v as [batch, heads, tokens, head_dim] (SDPA's layout) or [batch, tokens, heads, head_dim], settled
by running the reference; k and v may have heads of their own (grouped-query attention: the model then has half as
many key/value heads); an optional scale scalar gets 1/sqrt(head_dim). A reference that is not causal, or scales
otherwise, computes another op and fits no site. Forward kernels; the backward is trusted autograd.
"""

from __future__ import annotations

from typing import Any

import torch

from worker.canary.binding import CanaryUnsupported, Kernel, OpBinding, Site, SiteOptions
from worker.canary.families.common import const, head_dims, inputs, make, normal, outputs, require, scalar_roles
from worker.canary.kernel_call import call
from worker.canary.ops import Ops, attention_scale
from worker.canary.profiles import CanaryProfile
from worker.formats import Definition

SITE: Site = "attention"
NAMES = {"q": ("q", "query", "queries"), "k": ("k", "key", "keys"), "v": ("v", "value", "values")}


def _roles(d: Definition) -> tuple[dict[str, str], dict[str, str]]:
    ins, outs = inputs(d), outputs(d)
    roles = scalar_roles(SITE, ins, {"scale": ("scale", "sm", "softmax")})
    qkv = [a for a in ins if a.rank == 4 and a.floating]
    if len(qkv) != 3 or len(roles) + 3 != len(ins):
        raise CanaryUnsupported("an attention takes q, k and v as 4-D tensors (and optionally a scale)")
    named = {role: next((a for a in qkv if a.named(*words)), None) for role, words in NAMES.items()}
    order = [named[r] for r in ("q", "k", "v")] if all(named.values()) else qkv
    roles.update({a.name: r for a, r in zip(order, ("q", "k", "v"))})  # type: ignore[union-attr]
    q = order[0]
    if len(outs) != 1 or q is None or outs[0].axes != q.axes:
        raise CanaryUnsupported("an attention returns one tensor of q's shape")
    return roles, {outs[0].name: "y"}


def bind(d: Definition, options: SiteOptions) -> OpBinding:
    ins, outs = _roles(d)
    return make(SITE, d, ins, outs, options)


def proposals(d: Definition) -> list[SiteOptions]:
    _roles(d)
    require(d, ("scaled_dot_product_attention", "softmax"), "softmax or scaled_dot_product_attention")
    return [SiteOptions(heads_first=True), SiteOptions(heads_first=False)]


def dims(b: OpBinding, d: Definition, p: CanaryProfile) -> dict[str, int]:
    shapes = {s.role: d.inputs[s.name].shape or [] for s in b.inputs}
    q, k = shapes["q"], shapes["k"]
    h_at, t_at = (1, 2) if b.options.heads_first else (2, 1)
    fixed = {field: const(d, axis) for axis, field in ((q[0], "batch_size"), (q[t_at], "seq_len"))}
    return head_dims(d, p, q[h_at], k[h_at], q[3], {f: n for f, n in fixed.items() if n is not None})


def _kernel_layout(b: OpBinding, t: torch.Tensor) -> torch.Tensor:
    """[batch, heads, tokens, head_dim] as the definition lays it out."""
    return t if b.options.heads_first else t.transpose(1, 2).contiguous()


def example(b: OpBinding, p: CanaryProfile, gen: torch.Generator) -> dict[str, Any]:
    dh, t = p.d_model // p.n_heads, p.seq_len
    q, k, v = (normal((2, n, t, dh), gen) for n in (p.n_heads, p.kv_heads, p.kv_heads))
    return {
        "q": _kernel_layout(b, q),
        "k": _kernel_layout(b, k),
        "v": _kernel_layout(b, v),
        "scale": attention_scale(dh),
    }


def expected(b: OpBinding, v: dict[str, Any]) -> dict[str, torch.Tensor]:
    q, k, val = (t if b.options.heads_first else t.transpose(1, 2) for t in (v["q"], v["k"], v["v"]))
    return {"y": _kernel_layout(b, Ops().attention(q, k, val))}


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: OpBinding, kernel: Kernel
    ) -> torch.Tensor:
        ctx.save_for_backward(q, k, v)
        args = {"q": _kernel_layout(b, q), "k": _kernel_layout(b, k), "v": _kernel_layout(b, v)}
        y = call(b, kernel, {**args, "scale": attention_scale(q.shape[-1])}, {"y": tuple(args["q"].shape)})["y"]
        return (y if b.options.heads_first else y.transpose(1, 2)).to(q.dtype).contiguous()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(True) for t in ctx.saved_tensors]
            grads = torch.autograd.grad(Ops().attention(leaves[0], leaves[1], leaves[2]), leaves, g)
        return (*grads, None, None)


def apply(b: OpBinding, kernel: Kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [batch, heads, tokens, head_dim], k and v [batch, kv_heads, tokens, head_dim]."""
    return _Attention.apply(q, k, v, b, kernel)  # type: ignore[no-any-return]
