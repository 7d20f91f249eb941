"""Site "norm": RMSNorm, y = x * rsqrt(mean(x^2) + eps) * weight, one of the original sites, here matched from a
definition's signature and confirmed by its reference like the newer ones.

Signatures: forward (x [tokens, hidden], weight [hidden], eps) -> y [tokens, hidden] (and maybe rstd per token);
backward (x, weight, grad_output [tokens, hidden], eps, maybe rstd) -> grad_x [tokens, hidden] and maybe
grad_weight [hidden]. The roles are the original site's (worker.canary.binding.bind), so a matched definition trains
exactly as one whose audit.json names the site: every RMSNorm of the original model calls the kernel, through
worker.canary.sites._Norm. The example holds rows the site's op must get right where other norms differ from it:
rows on an offset (a LayerNorm subtracts their mean, an RMSNorm does not) and, where the definition takes eps, rows
whose mean square sits below eps (a reference that drops eps or adds it outside the root is far off there).

A LayerNorm forward (x [tokens, hidden], weight and bias [hidden], eps -> y) is the same site's other op
(SiteOptions.layer_norm): every norm of the model is then a LayerNorm with the kernel in it, its weight trained and its
bias held at zero (the model has no norm biases), the backward trusted autograd. Its example's rows on an offset are
where an RMSNorm is far off; a bias the reference drops is far off everywhere.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from worker.canary.binding import CanaryUnsupported, Kernel, OpBinding, Site, SiteOptions
from worker.canary.binding import bind as bind_original
from worker.canary.families.common import RMS_WORDS, inputs, make, normal, outputs, require, rows_dims, scalars, tensors
from worker.canary.kernel_call import call
from worker.canary.ops import Ops, rmsnorm
from worker.canary.profiles import CanaryProfile
from worker.formats import Definition
from worker.numerics.dtypes import to_torch

SITE: Site = "norm"
ROWS = 6  # rows of the example: two plain, two on an offset, two below eps (or plain, where eps is the reference's)


def rstd(x: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / rms per row, in fp32."""
    return torch.rsqrt(x.float().pow(2).mean(-1) + eps)


def rstd_for(b: OpBinding, r: torch.Tensor) -> torch.Tensor:
    """rstd in the rank the definition's rstd input has ([tokens] or [tokens, 1])."""
    spec = b.role_in("rstd")
    return r.unsqueeze(-1) if spec is not None and spec.rank == 2 else r


def _one_weight(d: Definition) -> None:
    """Refuses a second float vector over x's hidden axis (a LayerNorm's bias): the original site's roles would take
    it for a second weight, and say only that two arguments share a role."""
    rows = [a for a in tensors(inputs(d)) if a.rank == 2]
    hidden = rows[0].axes[-1:] if rows else ()
    vecs = [a.name for a in tensors(inputs(d)) if a.axes == hidden]
    if len(vecs) > 1:
        raise CanaryUnsupported(
            f"an RMSNorm scales by one [hidden] weight and adds no bias; this op takes {len(vecs)} [hidden] vectors "
            f"({', '.join(vecs)}), as a LayerNorm takes its weight and bias"
        )


def _shapes_fit(b: OpBinding, d: Definition) -> None:
    """x [tokens, hidden], the weight [hidden], grad_output and y or grad_x like x, grad_weight like the weight, rstd
    per token: the shapes worker.canary.sites._Norm hands the kernel."""
    axes = {s.role: tuple(d.inputs[s.name].shape or ()) for s in b.inputs if s.rank is not None}
    axes |= {"out_" + s.role: tuple(d.outputs[s.name].shape or ()) for s in b.outputs}
    x = axes["x"]
    want = {"norm_weight": x[-1:], "grad_output": x, "out_y": x, "out_grad_x": x, "out_grad_norm_weight": x[-1:]}
    bad = [r for r, a in want.items() if r in axes and axes[r] != a]
    bad += [r for r in ("rstd", "out_rstd") if r in axes and axes[r][:1] != x[:1]]
    if len(x) != 2 or bad:
        raise CanaryUnsupported(
            "an RMSNorm takes x as [tokens, hidden] and a [hidden] weight (its backward grad_output like x), and "
            "returns y or grad_x like x, grad_weight like the weight and rstd per token"
        )


def _layer_norm_roles(d: Definition) -> tuple[dict[str, str], dict[str, str]]:
    """A LayerNorm forward's roles: x [tokens, hidden], a weight and a bias [hidden] (the bias by its name), eps ->
    y like x."""
    ins, outs = inputs(d), outputs(d)
    rows = [a for a in tensors(ins) if a.rank == 2]
    vecs = [a for a in tensors(ins) if rows and a.axes == rows[0].axes[-1:]]
    biases = [a for a in vecs if any(w in a.name.lower() for w in ("bias", "beta"))]
    eps = [a for a in scalars(ins) if "eps" in a.name.lower()]
    if (
        len(rows) != 1
        or len(vecs) != 2
        or len(biases) != 1
        or len(ins) != 3 + len(eps)
        or len(outs) != 1
        or outs[0].axes != rows[0].axes
        or not outs[0].floating
    ):
        raise CanaryUnsupported(
            "a LayerNorm takes x [tokens, hidden], a weight and a bias [hidden] (and maybe eps) and returns y like x"
        )
    weight = next(a for a in vecs if a is not biases[0])
    roles = {rows[0].name: "x", weight.name: "norm_weight", biases[0].name: "norm_bias"}
    return roles | {a.name: "eps" for a in eps}, {outs[0].name: "y"}


def bind(d: Definition, options: SiteOptions) -> OpBinding:
    if options.layer_norm:
        ins, outs = _layer_norm_roles(d)
        return make(SITE, d, ins, outs, options)
    # the original site's roles, so that the binding trains as one audit.json names
    _one_weight(d)
    b = bind_original(SITE, d)
    _shapes_fit(b, d)
    return b


def proposals(d: Definition) -> list[SiteOptions]:
    try:
        b = bind(d, SiteOptions())
    except CanaryUnsupported as rms:
        try:
            _layer_norm_roles(d)
        except CanaryUnsupported:
            raise rms from None
        require(d, ("layer_norm", "mean(", ".var("), "LayerNorm")
        return [SiteOptions(layer_norm=True)]
    return rms_proposals(b, d)


def rms_proposals(b: OpBinding, d: Definition) -> list[SiteOptions]:
    """The one layout of an RMSNorm's roles, where the reference computes a root mean square."""
    if b.role_in("rstd") is None:  # a backward handed rstd need compute no root itself
        require(d, RMS_WORDS, "root mean square")
    return [SiteOptions()]


def dims(b: OpBinding, d: Definition, p: CanaryProfile) -> dict[str, int]:
    return rows_dims(b, d, p)


def example(b: OpBinding, p: CanaryProfile, gen: torch.Generator) -> dict[str, Any]:
    x_dtype = to_torch(next(s.dtype for s in b.inputs if s.role == "x"))
    takes_eps = b.role_in("eps") is not None
    # a reference with its own eps (no eps input) is confirmed only where any common eps (1e-5 or less) is negligible
    low = 0.1 * math.sqrt(p.norm_eps) if takes_eps else 1.0
    scales = torch.tensor([1.0, 1.0, 1.0, 1.0, low, low])[:, None]
    offsets = torch.tensor([0.0, 0.0, 2.0, -2.0, 0.0, 0.0])[:, None]
    # x in its own dtype already, so that an rstd input agrees with the x the reference receives
    x = (normal((ROWS, p.d_model), gen) * scales + offsets).to(x_dtype).float()
    return {
        "x": x,
        "norm_weight": 1.0 + normal((p.d_model,), gen, 0.1),
        "norm_bias": normal((p.d_model,), gen, 0.1),
        "grad_output": normal((ROWS, p.d_model), gen),
        "rstd": rstd_for(b, rstd(x, p.norm_eps)),
        "eps": p.norm_eps,
    }


def expected(b: OpBinding, v: dict[str, Any]) -> dict[str, torch.Tensor]:
    """y, the gradients of x and the weight by autograd of the fp32 RMSNorm, and rstd; a LayerNorm's y in fp64."""
    if b.options.layer_norm:
        x = v["x"].double()
        return {"y": F.layer_norm(x, (x.shape[-1],), v["norm_weight"].double(), v["norm_bias"].double(), v["eps"])}
    with torch.enable_grad():
        x, w = v["x"].detach().requires_grad_(True), v["norm_weight"].detach().requires_grad_(True)
        y = rmsnorm(x, w, v["eps"])
        gx, gw = torch.autograd.grad(y, (x, w), v["grad_output"])
    return {"y": y.detach(), "grad_x": gx, "grad_norm_weight": gw, "rstd": rstd(x.detach(), v["eps"])}


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, eps: float, b: OpBinding, kernel: Kernel) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.eps = eps
        x2 = x.reshape(-1, x.shape[-1])
        args = {"x": x2, "norm_weight": w, "norm_bias": torch.zeros_like(w), "eps": eps}
        return call(b, kernel, args, {"y": tuple(x2.shape)})["y"].reshape(x.shape).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        x, w = ctx.saved_tensors
        with torch.enable_grad():
            xd, wd = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
            gx, gw = torch.autograd.grad(Ops().layer_norm(xd, wd, ctx.eps), (xd, wd), g)
        return gx, gw, None, None, None


def apply_layer_norm(b: OpBinding, kernel: Kernel, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """A LayerNorm of the model (its bias zero) through the kernel."""
    return _LayerNorm.apply(x, w, eps, b, kernel)  # type: ignore[no-any-return]
