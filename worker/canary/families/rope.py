"""Site "rope": rotary position embedding of attention's q and k, in a model whose attention rotates them.

Signatures: (q [tokens, q_heads, head_dim], k [tokens, kv_heads, head_dim], positions [tokens], theta) -> (q', k'),
or one tensor (x, positions, theta) -> x', called once for q and once for k. The model's tokens sit at long positions:
each sequence of a batch starts at its own offset, spread up to CanaryProfile.rope_max_position, as windows of long
documents do, so a rotation that is only right near position 0 trains differently. Rotation is relative, so the
trusted model (angles in fp64) trains the same at any offset. The layout (NeoX halves or GPT-J pairs) and, where the
definition takes no theta, its theta are settled by running the reference. Forward kernels; the backward is trusted.
"""

from __future__ import annotations

from typing import Any

import torch

from worker.canary.binding import CanaryUnsupported, Kernel, OpBinding, Site, SiteOptions
from worker.canary.families.common import const, inputs, make, normal, outputs, scalar_roles, source, token_count
from worker.canary.kernel_call import call
from worker.canary.ops import Ops, RopeLayout, rope_angles, rotate
from worker.canary.profiles import CanaryProfile
from worker.formats import Definition

SITE: Site = "rope"
THETAS = (10000.0, 500000.0, 1000000.0)  # common bases, tried where a definition fixes its own


def _roles(d: Definition) -> tuple[dict[str, str], dict[str, str]]:
    ins, outs = inputs(d), outputs(d)
    roles = scalar_roles(SITE, ins, {"theta": ("theta", "base", "rope")})
    heads = [a for a in ins if a.rank == 3 and a.floating]
    pos = [a for a in ins if a.rank == 1 and not a.floating]
    if not 1 <= len(heads) <= 2 or len(pos) != 1 or len(roles) + len(heads) + 1 != len(ins):
        raise CanaryUnsupported(
            "a RoPE takes q and k (or one tensor) as [tokens, heads, head_dim] and integer positions"
        )
    if any(h.axes[0] != pos[0].axes[0] or h.axes[2] != heads[0].axes[2] for h in heads):
        raise CanaryUnsupported("q, k and positions must share the token axis, q and k the head dim")
    k_first = len(heads) == 2 and heads[0].named("k", "key", "keys") and not heads[1].named("k", "key", "keys")
    names = ["k", "q"] if k_first else ["q", "k"]
    roles.update({h.name: names[i] if len(heads) == 2 else "x" for i, h in enumerate(heads)})
    roles[pos[0].name] = "positions"
    if len(outs) != len(heads) or any(o.axes != h.axes for o, h in zip(outs, heads)):
        raise CanaryUnsupported("a RoPE returns its rotated tensors, in the order of its inputs")
    return roles, {o.name: f"{roles[h.name]}_out" for o, h in zip(outs, heads)}


def bind(d: Definition, options: SiteOptions) -> OpBinding:
    ins, outs = _roles(d)
    return make(SITE, d, ins, outs, options)


def proposals(d: Definition) -> list[SiteOptions]:
    ins, _ = _roles(d)
    text = source(d)
    if not ("cos" in text and "sin" in text):
        raise CanaryUnsupported("the reference computes no cos and sin")
    thetas: list[float | None] = [None] if "theta" in ins.values() else list(THETAS)
    layouts: list[RopeLayout] = ["neox", "interleaved"]
    return [SiteOptions(rope_layout=lay, rope_theta=t) for t in thetas for lay in layouts]


def dims(b: OpBinding, d: Definition, p: CanaryProfile) -> dict[str, int]:
    shapes = {s.role: d.inputs[s.name].shape or [] for s in b.inputs}
    q = shapes.get("q", shapes.get("x", []))
    out: dict[str, int] = {}
    heads, head_dim = const(d, q[1]), const(d, q[2])
    if heads is not None:
        out["n_heads"] = heads
    kv = const(d, shapes["k"][1]) if "k" in shapes else None
    if "k" in shapes and shapes["k"][1] != q[1]:
        out["n_kv_heads"] = kv if kv is not None else max(1, (heads or p.n_heads) // 2)  # kv heads of their own: GQA
    if head_dim is not None:
        out["d_model"] = head_dim * (heads or p.n_heads)
    return {**out, **token_count(p, const(d, q[0]))}


def _theta(b: OpBinding, p: CanaryProfile) -> float:
    return b.options.rope_theta if b.options.rope_theta is not None else p.rope_theta


def example(b: OpBinding, p: CanaryProfile, gen: torch.Generator) -> dict[str, Any]:
    dh, n = p.d_model // p.n_heads, 8
    positions = torch.randint(0, p.rope_max_position, (n,), generator=gen)
    q, k = normal((n, p.n_heads, dh), gen), normal((n, p.kv_heads, dh), gen)
    return {"q": q, "k": k, "x": q, "positions": positions, "theta": _theta(b, p)}


def expected(b: OpBinding, v: dict[str, Any]) -> dict[str, torch.Tensor]:
    q, k = Ops().rope(v["q"], v["k"], v["positions"], float(v["theta"]), b.options.rope_layout)
    return {"q_out": q, "k_out": k, "x_out": q}


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, theta: float, b: OpBinding, kernel: Kernel
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(positions)
        ctx.theta, ctx.layout = theta, b.options.rope_layout
        pos = positions.reshape(-1)
        q2, k2 = q.reshape(pos.numel(), *q.shape[-2:]), k.reshape(pos.numel(), *k.shape[-2:])
        if b.role_in("x") is not None:  # one tensor at a time
            qo = call(b, kernel, {"x": q2, "positions": pos, "theta": theta}, {"x_out": tuple(q2.shape)})["x_out"]
            ko = call(b, kernel, {"x": k2, "positions": pos, "theta": theta}, {"x_out": tuple(k2.shape)})["x_out"]
        else:
            got = call(
                b,
                kernel,
                {"q": q2, "k": k2, "positions": pos, "theta": theta},
                {"q_out": tuple(q2.shape), "k_out": tuple(k2.shape)},
            )
            qo, ko = got["q_out"], got["k_out"]
        return qo.to(q.dtype).reshape(q.shape), ko.to(k.dtype).reshape(k.shape)

    @staticmethod
    def backward(ctx: Any, gq: torch.Tensor, gk: torch.Tensor) -> tuple[Any, ...]:
        (positions,) = ctx.saved_tensors
        # a rotation's gradient is the upstream gradient rotated back: the trusted rotation by minus the angles
        angles = -rope_angles(positions, gq.shape[-1], ctx.theta)
        cos, sin = torch.cos(angles), torch.sin(angles)
        return rotate(gq, cos, sin, ctx.layout), rotate(gk, cos, sin, ctx.layout), None, None, None, None


def apply(
    b: OpBinding, kernel: Kernel, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [batch, tokens, q_heads, head_dim], k [batch, tokens, kv_heads, head_dim], positions [batch, tokens]."""
    return _Rope.apply(q, k, positions, theta, b, kernel)  # type: ignore[no-any-return]
