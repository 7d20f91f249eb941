"""Site "softmax": the softmax over the last axis of attention's scores, in a model whose attention is written out
(scores = q k^T / sqrt(d), causal keys at -inf, probs = softmax(scores), out = probs v) instead of fused.

The kernel gets every layer's scores in the definition's rank ([rows, keys] for 2-D, with rows = batch x heads x
queries; [batch x heads, queries, keys] for 3-D; [batch, heads, queries, keys] for 4-D) and dtype. A constant key axis
sets the canary's sequence length. Forward kernels; the backward is trusted autograd.
"""

from __future__ import annotations

from typing import Any

import torch

from worker.canary.binding import CanaryUnsupported, Kernel, OpBinding, Site, SiteOptions
from worker.canary.families.common import const, flat, inputs, make, normal, outputs, require
from worker.canary.kernel_call import call
from worker.canary.ops import Ops, causal_mask
from worker.canary.profiles import CanaryProfile
from worker.formats import Definition

SITE: Site = "softmax"


def _check(d: Definition) -> tuple[str, str]:
    ins, outs = inputs(d), outputs(d)
    if len(ins) != 1 or ins[0].rank is None or not ins[0].floating or ins[0].rank not in (2, 3, 4):
        raise CanaryUnsupported("a softmax takes one 2-D to 4-D float tensor")
    if len(outs) != 1 or outs[0].axes != ins[0].axes:
        raise CanaryUnsupported("a softmax returns one tensor of its input's shape")
    return ins[0].name, outs[0].name


def bind(d: Definition, options: SiteOptions) -> OpBinding:
    x, y = _check(d)
    return make(SITE, d, {x: "x"}, {y: "y"}, options)


def proposals(d: Definition) -> list[SiteOptions]:
    _check(d)
    require(d, ("softmax", "exp"), "softmax or exp")
    return [SiteOptions()]


def dims(b: OpBinding, d: Definition, p: CanaryProfile) -> dict[str, int]:
    keys = (d.inputs[b.inputs[0].name].shape or [""])[-1]
    if const(d, keys) is not None:
        return {"seq_len": const(d, keys)}  # type: ignore[dict-item]
    return {}


def _scores(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    s = normal(shape, gen, 3.0)
    return s.masked_fill(causal_mask(shape[-1], s.device), -torch.inf)


def example(b: OpBinding, p: CanaryProfile, gen: torch.Generator) -> dict[str, Any]:
    t = p.seq_len
    return {"x": flat(_scores((2, 2, t, t), gen), b.inputs[0].rank or 2)}


def expected(b: OpBinding, v: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {"y": Ops().softmax(v["x"])}


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, s: torch.Tensor, b: OpBinding, kernel: Kernel) -> torch.Tensor:
        ctx.save_for_backward(s)
        x = flat(s, b.inputs[0].rank or 2)
        return call(b, kernel, {"x": x}, {"y": tuple(x.shape)})["y"].to(s.dtype).reshape(s.shape)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        (s,) = ctx.saved_tensors
        with torch.enable_grad():
            sd = s.detach().requires_grad_(True)
            (gs,) = torch.autograd.grad(Ops().softmax(sd), sd, g)
        return gs, None, None


def apply(b: OpBinding, kernel: Kernel, scores: torch.Tensor) -> torch.Tensor:
    """scores [batch, heads, queries, keys]."""
    return _Softmax.apply(scores, b, kernel)  # type: ignore[no-any-return]
