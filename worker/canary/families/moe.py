"""Site "moe_routing": a mixture-of-experts router's top-k, in a model whose feed-forward is a mixture of experts.

The router's logits [tokens, experts] go to the kernel, which returns the k experts each token goes to and their
weights ([tokens, k] each: a float tensor and an integer one, in the definition's order); the model then sums the
picked experts' outputs with those weights. Whether the weights are renormalised over the k (or are the softmax's
own probabilities) is read from the reference. Constant expert and top-k axes set the model's; an integer scalar
named k or top_k gets the model's k. A forward kernel: the backward is trusted autograd of the weights' math
(worker.canary.ops.route_weights) at the experts the kernel picked, so a kernel that picks other experts trains
other experts, and its weights' errors are what the router and the experts learn from.
"""

from __future__ import annotations

from typing import Any

import torch

from worker.canary.binding import CanaryUnsupported, Kernel, OpBinding, Site, SiteOptions
from worker.canary.families.common import Arg, const, inputs, make, outputs, require, scalar_roles, tensors, token_count
from worker.canary.kernel_call import call
from worker.canary.ops import Ops, route_weights
from worker.canary.profiles import CanaryProfile
from worker.formats import Definition

SITE: Site = "moe_routing"


def _check(d: Definition) -> tuple[Arg, Arg, Arg, dict[str, str]]:
    """(logits, weights, ids, the scalars' roles) where the signature is a top-k routing's."""
    ins, outs = inputs(d), outputs(d)
    floats = tensors(ins)
    if len(floats) != 1 or floats[0].rank != 2 or len(floats) + sum(a.rank is None for a in ins) != len(ins):
        raise CanaryUnsupported("a top-k routing takes one 2-D float tensor of router logits (and at most a k)")
    logits = floats[0]
    scalars = scalar_roles(SITE, ins, {"top_k": ("k", "topk", "top")})
    if len(scalars) > 1 or any(d.inputs[n].dtype.startswith("float") for n in scalars):
        raise CanaryUnsupported("a top-k routing's one scalar is its integer k")
    w = [o for o in outs if o.rank == 2 and o.floating]
    ids = [o for o in outs if o.rank == 2 and not o.floating]
    if len(outs) != 2 or len(w) != 1 or len(ids) != 1 or w[0].axes != ids[0].axes:
        raise CanaryUnsupported(
            "a top-k routing returns a float tensor of weights and one of expert ids, both [tokens, k]"
        )
    if w[0].axes[0] != logits.axes[0] or w[0].axes[1] == logits.axes[1]:
        raise CanaryUnsupported("a top-k routing's outputs are [tokens, k] for logits [tokens, experts]")
    return logits, w[0], ids[0], scalars


def bind(d: Definition, options: SiteOptions) -> OpBinding:
    logits, w, ids, scalars = _check(d)
    return make(SITE, d, {logits.name: "logits", **scalars}, {w.name: "weights", ids.name: "ids"}, options)


def proposals(d: Definition) -> list[SiteOptions]:
    _check(d)
    require(d, ("topk", "sort", "argsort"), "top-k selection")
    require(d, ("softmax", "exp"), "softmax")
    return [SiteOptions(moe_renorm=True), SiteOptions(moe_renorm=False)]


def dims(b: OpBinding, d: Definition, p: CanaryProfile) -> dict[str, int]:
    tokens, experts = d.inputs[_name(b, "logits")].shape or ["", ""]
    k_axis = (d.outputs[b.outputs[0].name].shape or ["", ""])[1]
    out: dict[str, int] = {}
    if const(d, experts) is not None:
        out["n_experts"] = const(d, experts)  # type: ignore[assignment]
    if const(d, k_axis) is not None:
        out["top_k"] = const(d, k_axis)  # type: ignore[assignment]
    if out.get("top_k", p.top_k) > out.get("n_experts", p.n_experts):
        raise CanaryUnsupported(
            f"top_k {out.get('top_k', p.top_k)} exceeds {out.get('n_experts', p.n_experts)} experts"
        )
    return {**out, **token_count(p, const(d, tokens))}


def _name(b: OpBinding, role: str) -> str:
    return next(s.name for s in b.inputs if s.role == role)


def example(b: OpBinding, p: CanaryProfile, gen: torch.Generator) -> dict[str, Any]:
    """Logits without ties: each row a permutation of evenly spaced values (exact in bf16), shifted by a multiple of
    the spacing. How ties are broken is the definition's own (its oracle judges the kernel); the match asks only that
    the reference computes a top-k routing."""
    rows, e = 96, p.n_experts
    step = 0.25 if e <= 256 else 1.0
    perm = torch.stack([torch.randperm(e, generator=gen) for _ in range(rows)]).float()
    shift = torch.randint(-8, 9, (rows, 1), generator=gen).float()
    return {"logits": (perm - e / 2 + shift) * step, "top_k": p.top_k}


def expected(b: OpBinding, v: dict[str, Any]) -> dict[str, torch.Tensor]:
    w, ids = Ops().moe_route(v["logits"], int(v["top_k"]), b.options.moe_renorm)
    return {"weights": w, "ids": ids}


class _Route(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, k: int, b: OpBinding, kernel: Kernel) -> tuple[torch.Tensor, ...]:
        lead, e = logits.shape[:-1], logits.shape[-1]
        x = logits.reshape(-1, e)
        got = call(b, kernel, {"logits": x, "top_k": k}, {"weights": (x.shape[0], k), "ids": (x.shape[0], k)})
        ids = got["ids"].to(device=logits.device, dtype=torch.long)
        if bool(((ids < 0) | (ids >= e)).any()):  # the gather below would fail with a less telling error
            raise ValueError(f"the kernel's expert ids are outside [0, {e})")
        w = got["weights"].to(logits.dtype).reshape(*lead, k)
        ids = ids.reshape(*lead, k)
        ctx.save_for_backward(logits, ids)
        ctx.renorm = b.options.moe_renorm
        ctx.mark_non_differentiable(ids)
        return w, ids

    @staticmethod
    def backward(ctx: Any, gw: torch.Tensor, _gids: Any) -> tuple[Any, ...]:
        logits, ids = ctx.saved_tensors
        with torch.enable_grad():
            ld = logits.detach().requires_grad_(True)
            (gl,) = torch.autograd.grad(route_weights(ld, ids, ctx.renorm), ld, gw)
        return gl, None, None, None


def apply(b: OpBinding, kernel: Kernel, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [..., experts] -> (weights, ids), each [..., k]."""
    w, ids = _Route.apply(logits, k, b, kernel)
    return w, ids
