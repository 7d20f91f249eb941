"""Site "linear": y = act(x @ W^T + b) in the MLP, forward, or its backward (grad_input / grad_weight / grad_bias).
A forward GEMM may add the residual stream to its output (y = x @ W^T + residual, a projection fused with its block's
skip connection): it is then the down-projection together with the residual add that follows it in the model.

Where: a GEMM with its own activation (gemm + bias + GELU) is the MLP's up-projection fc1, the activation then being
the kernel's; a bare GEMM, and every GEMM backward, is the down-projection fc2, whose reduction (d_ff) is the model's
longest and whose weight gradient sums over every token of the batch. A forward kernel's backward is trusted
autograd; a backward kernel's forward is the trusted linear, and the activation's own derivative stays trusted.
"""

from __future__ import annotations

from typing import Any

import torch

from worker.canary.binding import CanaryUnsupported, Kernel, OpBinding, Site, SiteOptions
from worker.canary.families.common import (
    Arg,
    autocast_state,
    const,
    flat,
    inputs,
    make,
    normal,
    outputs,
    source,
    token_count,
    under,
)
from worker.canary.kernel_call import call
from worker.canary.ops import Act, Ops, activation
from worker.canary.profiles import CanaryProfile
from worker.formats import Definition

SITE: Site = "linear"
ACTS: dict[Act, tuple[str, ...]] = {
    "gelu_tanh": ("gelu", "tanh"),
    "gelu": ("gelu",),
    "silu": ("silu",),
    "relu": ("relu",),
}


def _input_roles(d: Definition) -> dict[str, str]:
    roles: dict[str, str] = {}
    ins = inputs(d)
    for a in ins:
        if a.rank is None or not a.floating:
            raise CanaryUnsupported(f"input '{a.name}' is a scalar or integer; a linear takes float tensors only")
        if a.name.lower().startswith(("grad", "dy", "dout", "d_out")):
            roles[a.name] = "grad_output"
        elif a.named("residual", "res", "skip", "shortcut"):
            roles[a.name] = "residual"
        elif a.rank == 1:
            roles[a.name] = "bias"
        elif a.named("weight", "w", "weights", "mat2"):
            roles[a.name] = "weight"
    rest = [a.name for a in ins if a.name not in roles]
    if "weight" not in roles.values() and len(rest) == 2:  # C = A @ B: the second matrix is the weight
        roles[rest[1]] = "weight"
        rest = rest[:1]
    roles.update({name: "x" for name in rest})
    return roles


def _axes(d: Definition, roles: dict[str, str]) -> dict[str, Arg]:
    by_role = {r: Arg(k, d.inputs[k]) for k, r in roles.items()}
    if "weight" not in by_role or by_role["weight"].rank != 2:
        raise CanaryUnsupported("a linear needs one 2-D weight matrix")
    if "x" not in by_role and "grad_output" not in by_role:
        raise CanaryUnsupported("a linear needs an activation input (or, backward, grad_output)")
    if any(a.rank not in (2, 3) for r, a in by_role.items() if r in ("x", "grad_output")):
        raise CanaryUnsupported("a linear's activations must be 2-D or 3-D")
    return by_role


def _orientations(by_role: dict[str, Arg]) -> list[bool]:
    """Possible weight layouts (weight_in_out); several where the axes do not tell (a square weight of one axis)."""
    w0, w1 = by_role["weight"].axes
    if "x" in by_role:
        k = by_role["x"].axes[-1]
        found = ([False] if w1 == k else []) + ([True] if w0 == k else [])
    else:
        n = by_role["grad_output"].axes[-1]
        found = ([False] if w0 == n else []) + ([True] if w1 == n else [])
    if not found:
        raise CanaryUnsupported("the weight shares no axis with the input's reduction axis")
    return found


def _output_roles(d: Definition, by_role: dict[str, Arg], backward: bool) -> dict[str, str]:
    outs = outputs(d)
    if not backward:
        if len(outs) != 1:
            raise CanaryUnsupported("a linear forward has one output")
        return {outs[0].name: "y"}
    roles: dict[str, str] = {}
    for o in outs:
        if o.rank == 1:
            roles[o.name] = "grad_bias"
        elif o.axes == by_role["weight"].axes:
            roles[o.name] = "grad_weight"
        elif ("x" in by_role and o.axes == by_role["x"].axes) or o.named("input", "x", "dx"):
            roles[o.name] = "grad_x"
        else:
            raise CanaryUnsupported(f"output '{o.name}' is neither grad_input, grad_weight nor grad_bias")
    return roles


def bind(d: Definition, options: SiteOptions) -> OpBinding:
    roles = _input_roles(d)
    by_role = _axes(d, roles)
    backward = "grad_output" in by_role
    b = make(SITE, d, roles, _output_roles(d, by_role, backward), options)
    if not backward and "x" not in by_role:
        raise CanaryUnsupported("a linear forward needs an activation input")
    if "residual" in by_role and (backward or options.act != "none"):
        raise CanaryUnsupported("a residual is added to a bare GEMM's forward output only")
    if b.role_out("grad_weight") is not None and "x" not in by_role:
        raise CanaryUnsupported("grad_weight needs the layer's input")
    if b.role_out("grad_x") is not None and "weight" not in by_role:
        raise CanaryUnsupported("grad_input needs the weight")
    return b


def proposals(d: Definition) -> list[SiteOptions]:
    roles = _input_roles(d)
    by_role = _axes(d, roles)
    text = source(d)
    if not any(w in text for w in ("linear", "matmul", "@", "mm(", "einsum")):
        raise CanaryUnsupported("the reference has no matrix product")
    # a fused activation only where the reference names one (longest name first: gelu with tanh is gelu_tanh)
    named: list[Act] = [a for a, words in ACTS.items() if all(w in text for w in words)][:1]
    acts: list[Act] = ["none"] if "grad_output" in by_role or "residual" in by_role else [*named, "none"]
    return [SiteOptions(act=a, weight_in_out=o) for a in acts for o in _orientations(by_role)]


def _kn(b: OpBinding) -> tuple[str, str]:
    """The profile sizes of the reduction (K) and output (N) axes: fc1 is d_model -> d_ff, fc2 d_ff -> d_model."""
    fc1 = b.options.act != "none" and not b.has_backward
    return ("d_model", "d_ff") if fc1 else ("d_ff", "d_model")


def dims(b: OpBinding, d: Definition, p: CanaryProfile) -> dict[str, int]:
    w = d.inputs[next(s.name for s in b.inputs if s.role == "weight")].shape or []
    n_axis, k_axis = (w[1], w[0]) if b.options.weight_in_out else (w[0], w[1])
    k_name, n_name = _kn(b)
    out: dict[str, int] = {}
    if k_axis == n_axis:  # a square weight of one axis: the model's projection must be square too
        out = {"d_ff": const(d, k_axis) or p.d_model, "d_model": const(d, k_axis) or p.d_model}
    for axis, name in ((k_axis, k_name), (n_axis, n_name)):
        if const(d, axis) is not None:
            out[name] = const(d, axis)  # type: ignore[assignment]
    act_in = next((s for s in b.inputs if s.role in ("x", "grad_output")), None)
    if act_in is not None and act_in.rank == 2:
        out.update(token_count(p, const(d, (d.inputs[act_in.name].shape or [""])[0])))
    return out


def _shapes(b: OpBinding, p: CanaryProfile) -> tuple[int, int]:
    k_name, n_name = _kn(b)
    return int(getattr(p, k_name)), int(getattr(p, n_name))


def example(b: OpBinding, p: CanaryProfile, gen: torch.Generator) -> dict[str, Any]:
    k, n = _shapes(b, p)
    lead = (2, 3) if any(s.rank == 3 for s in b.inputs if s.role in ("x", "grad_output")) else (6,)
    w = normal((n, k), gen, k**-0.5)
    return {
        "x": normal((*lead, k), gen),
        "weight": w.t() if b.options.weight_in_out else w,
        "bias": normal((n,), gen, 0.1),
        "grad_output": normal((*lead, n), gen),
        "residual": normal((*lead, n), gen),
    }


def expected(b: OpBinding, v: dict[str, Any]) -> dict[str, torch.Tensor]:
    w = v["weight"].t() if b.options.weight_in_out else v["weight"]
    bias = v["bias"] if b.role_in("bias") is not None else None
    if not b.has_backward:
        y = Ops().linear(v["x"], w, bias, b.options.act)
        return {"y": y + v["residual"] if b.role_in("residual") is not None else y}
    g = flat(v["grad_output"], 2)
    gw = g.t() @ flat(v["x"], 2)
    return {
        "grad_x": (g @ w).reshape(*v["grad_output"].shape[:-1], w.shape[1]),
        "grad_weight": gw.t() if b.options.weight_in_out else gw,
        "grad_bias": g.sum(0),
    }


def _args(
    b: OpBinding, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None = None
) -> dict[str, Any]:
    rank = next((s.rank for s in b.inputs if s.role in ("x", "grad_output")), 2) or 2
    return {
        "x": flat(x, rank),
        "weight": w.t() if b.options.weight_in_out else w,
        "bias": bias,
        "residual": None if residual is None else flat(residual, rank),
    }


class _Forward(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        w: torch.Tensor,
        bias: torch.Tensor | None,
        residual: torch.Tensor | None,
        act: Act,
        b: OpBinding,
        kernel: Kernel,
    ) -> torch.Tensor:
        ctx.save_for_backward(x, w, bias)
        ctx.act, ctx.autocast, ctx.residual = act, autocast_state(x), residual is not None
        args = _args(b, x, w, bias, residual)
        shape = (*args["x"].shape[:-1], w.shape[0])
        y = call(b, kernel, args, {"y": shape})["y"].to(x.dtype).reshape(*x.shape[:-1], w.shape[0])
        # a bare GEMM's kernel: the model's activation follows it (trusted); a fused one's already applied it
        return activation(y, act) if b.options.act == "none" else y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        x, w, bias = ctx.saved_tensors
        with torch.enable_grad(), under(ctx.autocast):
            leaves = [t.detach().requires_grad_(True) for t in (x, w) + ((bias,) if bias is not None else ())]
            grads = torch.autograd.grad(
                Ops().linear(leaves[0], leaves[1], leaves[2] if bias is not None else None, ctx.act), leaves, g
            )
        # the residual is added: its gradient is the output's
        return grads[0], grads[1], grads[2] if bias is not None else None, g if ctx.residual else None, None, None, None


class _Backward(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, act: Act, b: OpBinding, kernel: Kernel
    ) -> torch.Tensor:
        ctx.save_for_backward(x, w, bias)
        ctx.act, ctx.b, ctx.kernel, ctx.autocast = act, b, kernel, autocast_state(x)
        return Ops().linear(x, w, bias, act)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        x, w, bias = ctx.saved_tensors
        b: OpBinding = ctx.b
        if ctx.act != "none":  # the activation's derivative is trusted; the kernel gets the pre-activation's gradient
            with torch.enable_grad(), under(ctx.autocast):
                z = Ops().linear(x, w, bias, "none").detach().requires_grad_(True)
                (g,) = torch.autograd.grad(activation(z, ctx.act), z, g)
        args = {
            **_args(b, x, w, bias),
            "grad_output": flat(g, next(s.rank for s in b.inputs if s.role == "grad_output") or 2),
        }
        wk = args["weight"]
        got = call(
            b,
            ctx.kernel,
            args,
            {"grad_x": tuple(args["x"].shape), "grad_weight": tuple(wk.shape), "grad_bias": (w.shape[0],)},
        )
        g2, x2 = flat(g, 2), flat(x, 2)
        with under(ctx.autocast):  # the gradients the kernel does not give, in the forward's precision
            gx = got["grad_x"].to(x.dtype).reshape(x.shape) if "grad_x" in got else (g2 @ w).reshape(x.shape)
            gw = got["grad_weight"].to(w.dtype) if "grad_weight" in got else None
            if gw is not None and b.options.weight_in_out:
                gw = gw.t()
            gw = gw if gw is not None else (g2.t() @ x2).to(w.dtype)
            gb = None if bias is None else (got["grad_bias"].to(bias.dtype) if "grad_bias" in got else g2.sum(0))
        return gx, gw, gb, None, None, None


def apply(
    b: OpBinding,
    kernel: Kernel,
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    act: Act,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """The site's op at the model's projection; with `residual` (a binding with that role), the projection plus it."""
    if b.has_backward:
        return _Backward.apply(x, w, bias, act, b, kernel)  # type: ignore[no-any-return]
    return _Forward.apply(x, w, bias, residual, act, b, kernel)  # type: ignore[no-any-return]
