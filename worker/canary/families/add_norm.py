"""Site "add_norm": a residual add and an RMSNorm in one op, in either order.

Add then norm, s = residual + x, y = rmsnorm(s) * weight. With two outputs (y and the new residual s, as vLLM's
fused_add_rms_norm) the model is pre-norm: every sublayer's output is added to the residual stream by the kernel,
which also normalises the sum for the next sublayer; the stream is what the kernel returns, in its dtype (a
definition that keeps the residual in fp32 keeps the model's stream in fp32). With only y the model is post-norm,
h = norm(h + sublayer(h)).

Norm then add (SiteOptions.norm_then_add), y = residual + rmsnorm(x) * weight with one output: OLMo 2/3's block,
h = h + norm(sublayer(h)), with a final norm before the head. The kernel's output is the residual stream itself, never
normalised inside the blocks, so what it gets wrong is carried into every later block. Its signature is the
add-then-norm's, so matching tells the two apart by running the reference; a second output (the new residual) is
the sum that add-then-norm normalises, so only one-output definitions are proposed both ways.

Forward kernels; the backward is trusted autograd.
"""

from __future__ import annotations

from typing import Any

import torch

from worker.canary.binding import CanaryUnsupported, Kernel, OpBinding, Site, SiteOptions
from worker.canary.families.common import (
    RMS_WORDS,
    inputs,
    make,
    normal,
    outputs,
    require,
    rows_dims,
    scalar_roles,
    tensors,
)
from worker.canary.kernel_call import call
from worker.canary.ops import Ops, rmsnorm
from worker.canary.profiles import CanaryProfile
from worker.formats import Definition

SITE: Site = "add_norm"


def _roles(d: Definition) -> tuple[dict[str, str], dict[str, str]]:
    ins, outs = inputs(d), outputs(d)
    ins_roles = scalar_roles(SITE, ins, {"eps": ("eps", "epsilon", "variance")})
    rows = [a for a in tensors(ins) if a.rank == 2]
    vecs = [a for a in tensors(ins) if a.rank == 1]
    if len(rows) != 2 or rows[0].axes != rows[1].axes or len(vecs) != 1 or vecs[0].axes != rows[0].axes[-1:]:
        raise CanaryUnsupported("an add+norm takes two [tokens, hidden] tensors and a [hidden] weight")
    if len(ins_roles) + 3 != len(ins):
        raise CanaryUnsupported("an add+norm's inputs are x, residual, weight and eps")
    res_first = rows[0].named("residual", "res", "skip") and not rows[1].named("residual", "res", "skip")
    ins_roles.update(
        {
            rows[0].name: "residual" if res_first else "x",
            rows[1].name: "x" if res_first else "residual",
            vecs[0].name: "norm_weight",
        }
    )
    if not 1 <= len(outs) <= 2 or any(o.axes != rows[0].axes for o in outs):
        raise CanaryUnsupported("an add+norm returns y, or y and the new residual, each [tokens, hidden]")
    if len(outs) == 1:
        return ins_roles, {outs[0].name: "y"}
    res_out_first = outs[0].named("residual", "res", "sum", "skip") and not outs[1].named(
        "residual", "res", "sum", "skip"
    )
    return ins_roles, {
        outs[0].name: "residual" if res_out_first else "y",
        outs[1].name: "y" if res_out_first else "residual",
    }


def bind(d: Definition, options: SiteOptions) -> OpBinding:
    ins, outs = _roles(d)
    if options.norm_then_add and len(outs) != 1:
        raise CanaryUnsupported("a norm-then-add returns y alone: the residual it adds is its input")
    return make(SITE, d, ins, outs, options)


def proposals(d: Definition) -> list[SiteOptions]:
    _roles(d)
    require(d, RMS_WORDS, "root mean square")
    if len(outputs(d)) == 2:  # y and the new residual: the sum is normalised, so the add comes first
        return [SiteOptions()]
    # add then norm first, so that every definition matched before keeps its match
    return [SiteOptions(), SiteOptions(norm_then_add=True)]


def dims(b: OpBinding, d: Definition, p: CanaryProfile) -> dict[str, int]:
    return rows_dims(b, d, p)


def example(b: OpBinding, p: CanaryProfile, gen: torch.Generator) -> dict[str, Any]:
    return {
        "x": normal((6, p.d_model), gen),
        "residual": normal((6, p.d_model), gen, 3.0),
        "norm_weight": 1.0 + normal((p.d_model,), gen, 0.1),
        "eps": p.norm_eps,
    }


def expected(b: OpBinding, v: dict[str, Any]) -> dict[str, torch.Tensor]:
    if b.options.norm_then_add:
        return {"y": Ops().norm_add(v["x"], v["residual"], v["norm_weight"], v["eps"])}
    y, s = Ops().add_norm(v["x"], v["residual"], v["norm_weight"], v["eps"])
    return {"y": y, "residual": s}


class _AddNorm(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float, b: OpBinding, kernel: Kernel
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(x, r, w)
        ctx.eps = eps
        h = x.shape[-1]
        shape = (x.numel() // h, h)
        got = call(
            b,
            kernel,
            {"x": x.reshape(shape), "residual": r.reshape(shape), "norm_weight": w, "eps": eps},
            {"y": shape, "residual": shape},
        )
        s = got["residual"].to(r.dtype).reshape(r.shape) if "residual" in got else r + x
        return got["y"].to(x.dtype).reshape(x.shape), s

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor, gs: torch.Tensor) -> tuple[Any, ...]:
        x, r, w = ctx.saved_tensors
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(True) for t in (x, r, w)]
            s = leaves[1] + leaves[0]
            gx, gr, gw = torch.autograd.grad((rmsnorm(s, leaves[2], ctx.eps), s), leaves, (gy, gs))
        return gx, gr, gw, None, None, None


def apply(
    b: OpBinding, kernel: Kernel, x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return _AddNorm.apply(x, r, w, eps, b, kernel)  # type: ignore[no-any-return]


class _NormAdd(torch.autograd.Function):
    """y = residual + rmsnorm(x) * weight: the kernel's forward; the backward is the trusted norm's, the residual's
    gradient passed straight through (it is added)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float, b: OpBinding, kernel: Kernel
    ) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.eps, ctx.r_dtype = eps, r.dtype
        h = x.shape[-1]
        shape = (x.numel() // h, h)
        got = call(
            b, kernel, {"x": x.reshape(shape), "residual": r.reshape(shape), "norm_weight": w, "eps": eps}, {"y": shape}
        )
        # the dtype the trusted op's sum has (Ops.norm_add), whatever the definition's
        return got["y"].to(torch.promote_types(x.dtype, r.dtype)).reshape(r.shape)

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[Any, ...]:
        x, w = ctx.saved_tensors
        with torch.enable_grad():
            xd, wd = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
            gx, gw = torch.autograd.grad(rmsnorm(xd, wd, ctx.eps), (xd, wd), gy.to(x.dtype))
        return gx, gy.to(ctx.r_dtype), gw, None, None, None


def apply_norm_add(
    b: OpBinding, kernel: Kernel, x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float
) -> torch.Tensor:
    return _NormAdd.apply(x, r, w, eps, b, kernel)  # type: ignore[no-any-return]
