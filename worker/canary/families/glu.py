"""Site "glu": a gated MLP's first half, act(x @ Wg^T) * (x @ Wu^T) (SwiGLU with silu, GeGLU with gelu), in a model
whose MLP is gated.

Four signatures fit: the activation alone on (gate, up) or on one [gate | up] tensor, where the projections before it
are trusted; or the whole gate-up with x and the two weights, or one stacked [Wg; Wu] weight. The activation and
which half is the gate are settled by running the reference (worker.canary.matching). Forward kernels only: the
backward is trusted autograd.
"""

from __future__ import annotations

from typing import Any

import torch

from worker.canary.binding import CanaryUnsupported, Kernel, OpBinding, Site, SiteOptions
from worker.canary.families.common import const, flat, flat_shape, inputs, make, normal, outputs, source, token_count
from worker.canary.kernel_call import call
from worker.canary.ops import Act, Ops, activation, matmul_t
from worker.canary.profiles import CanaryProfile
from worker.formats import Definition

SITE: Site = "glu"
# the words that name each activation in a reference (silu is also written x * sigmoid(x))
ACTS: dict[Act, tuple[tuple[str, ...], ...]] = {
    "silu": (("silu",), ("sigmoid",), ("swish",)),
    "gelu_tanh": (("gelu", "tanh"),),
    "gelu": (("gelu",),),
    "relu": (("relu",),),
}


def _form(d: Definition) -> tuple[str, dict[str, str]]:
    """Which of the four signatures, and the input roles in the order the names suggest."""
    ins, outs = inputs(d), outputs(d)
    if any(a.rank is None or not a.floating for a in ins):
        raise CanaryUnsupported("a GLU takes float tensors only (no scalars, no ids)")
    if len(outs) != 1 or outs[0].rank is None or outs[0].rank not in (2, 3):
        raise CanaryUnsupported("a GLU has one 2-D or 3-D output")
    y = outs[0]
    like_y = [a for a in ins if a.axes == y.axes]
    if len(ins) == 2 and len(like_y) == 2:
        first_up = ins[0].named("up", "u") or ins[1].named("gate", "g")
        return "act", {ins[0].name: "up" if first_up else "gate", ins[1].name: "gate" if first_up else "up"}
    rows = [a for a in ins if a.axes[:-1] == y.axes[:-1] and a.axes[-1] != y.axes[-1]]
    if len(ins) == 1 and len(rows) == 1:
        return "act_fused", {ins[0].name: "gate_up"}
    weights = [a for a in ins if a not in rows and a.rank == 2]
    if len(rows) == 1 and len(weights) + 1 == len(ins) and all(w.axes[-1] == rows[0].axes[-1] for w in weights):
        if len(weights) == 2 and all(w.axes[0] == y.axes[-1] for w in weights):
            first_up = weights[0].named("up", "u", "w3") or weights[1].named("gate", "g", "w1")
            return "proj", {
                rows[0].name: "x",
                weights[0].name: "w_up" if first_up else "w_gate",
                weights[1].name: "w_gate" if first_up else "w_up",
            }
        if len(weights) == 1:
            return "proj_fused", {rows[0].name: "x", weights[0].name: "w_gate_up"}
    raise CanaryUnsupported("a GLU takes (gate, up), one [gate | up] tensor, or x with gate and up weights")


def bind(d: Definition, options: SiteOptions) -> OpBinding:
    _, roles = _form(d)
    return make(SITE, d, roles, {next(iter(d.outputs)): "y"}, options)


def proposals(d: Definition) -> list[SiteOptions]:
    _form(d)  # raises where the signature is none of the four
    text = source(d)
    acts = [a for a, spellings in ACTS.items() if any(all(w in text for w in words) for words in spellings)]
    if not acts:
        raise CanaryUnsupported("the reference names no gate activation (silu, sigmoid, gelu, relu)")
    # gelu_tanh is named with gelu: where both match, the first (tanh) is tried first and the reference decides
    return [SiteOptions(act=a, gate_first=g) for a in acts for g in (True, False)]


def dims(b: OpBinding, d: Definition, p: CanaryProfile) -> dict[str, int]:
    y = d.outputs[b.outputs[0].name].shape or []
    out: dict[str, int] = {}
    if const(d, y[-1]) is not None:
        out["d_ff"] = const(d, y[-1])  # type: ignore[assignment]
    x = next((s for s in b.inputs if s.role == "x"), None)
    if x is not None and const(d, (d.inputs[x.name].shape or [""])[-1]) is not None:
        out["d_model"] = const(d, (d.inputs[x.name].shape or [""])[-1])  # type: ignore[assignment]
    if len(y) == 2:
        out.update(token_count(p, const(d, y[0])))
    return out


def _halves(b: OpBinding, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate, up) from one stacked tensor (along its last axis, or a weight's first)."""
    a, c = t.chunk(2, dim=-1 if b.role_in("gate_up") is not None else 0)
    return (a, c) if b.options.gate_first else (c, a)


def _join(b: OpBinding, gate: torch.Tensor, up: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.cat([gate, up] if b.options.gate_first else [up, gate], dim=dim).contiguous()


def _values(b: OpBinding, x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor) -> dict[str, Any]:
    """The kernel's arguments by role: the trusted projections for an activation-only kernel."""
    rank = b.outputs[0].rank or 2
    if b.role_in("x") is not None:
        return {"x": flat(x, rank), "w_gate": wg, "w_up": wu, "w_gate_up": _join(b, wg, wu, 0)}
    gate, up = flat(matmul_t(x, wg), rank), flat(matmul_t(x, wu), rank)
    return {"gate": gate, "up": up, "gate_up": _join(b, gate, up, -1)}


def example(b: OpBinding, p: CanaryProfile, gen: torch.Generator) -> dict[str, Any]:
    lead = (2, 3) if b.outputs[0].rank == 3 else (6,)
    x, wg, wu = (
        normal((*lead, p.d_model), gen),
        normal((p.d_ff, p.d_model), gen, p.d_model**-0.5),
        normal((p.d_ff, p.d_model), gen, p.d_model**-0.5),
    )
    return _values(b, x, wg, wu)


def expected(b: OpBinding, v: dict[str, Any]) -> dict[str, torch.Tensor]:
    if b.role_in("x") is not None:
        wg, wu = (v["w_gate"], v["w_up"]) if b.role_in("w_gate_up") is None else _halves(b, v["w_gate_up"])
        return {"y": Ops().glu(v["x"], wg, wu, b.options.act)}
    gate, up = (v["gate"], v["up"]) if b.role_in("gate_up") is None else _halves(b, v["gate_up"])
    return {"y": activation(gate, b.options.act) * up}


class _Glu(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, act: Act, b: OpBinding, kernel: Kernel
    ) -> torch.Tensor:
        ctx.save_for_backward(x, wg, wu)
        ctx.act = act
        shape = (*x.shape[:-1], wg.shape[0])
        y = call(b, kernel, _values(b, x, wg, wu), {"y": flat_shape(shape, b.outputs[0].rank or 2)})["y"]
        return y.to(x.dtype).reshape(shape)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        x, wg, wu = ctx.saved_tensors
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(True) for t in (x, wg, wu)]
            grads = torch.autograd.grad(Ops().glu(leaves[0], leaves[1], leaves[2], ctx.act), leaves, g)
        return (*grads, None, None, None)


def apply(b: OpBinding, kernel: Kernel, x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, act: Act) -> torch.Tensor:
    return _Glu.apply(x, wg, wu, act, b, kernel)  # type: ignore[no-any-return]
