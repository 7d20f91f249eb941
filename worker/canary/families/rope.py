"""Site "rope": rotary position embedding of attention's q and k, in a model whose attention rotates them.

Signatures, from positions: (q [tokens, q_heads, head_dim], k [tokens, kv_heads, head_dim], positions [tokens],
theta) -> (q', k'), or one tensor (x, positions, theta) -> x', called once for q and once for k. The layout (NeoX
halves or GPT-J pairs) and, where the definition takes no theta, its theta are settled by running the reference.

From tables (FLUX's rope, HF's apply_rotary_pos_emb): q and k (or one tensor) as [tokens, heads, head_dim] or
[batch, seq, heads, head_dim], and two float tables named cos and sin, one row per token (rank 3) or per sequence
position (rank 4), the positions implicit in the rows. A table has head_dim columns laid out as the rotation reads
them (NeoX: cat(f, f) over the halves; GPT-J: each pair's value in both of its slots), or head_dim/2 columns, one per
pair (SiteOptions.rope_half_table, where the axes leave it open: settled with the layout by running the reference).
The trusted side builds the tables at the model's positions and theta, in fp32 from fp64 angles, and hands them to
the kernel at the definition's dtype; the kernel rotates by whatever they say.

The model's tokens sit at long positions: each sequence of a batch starts at its own offset, spread up to
CanaryProfile.rope_max_position, as windows of long documents do, so a rotation that is only right near position 0
trains differently. Rotation is relative, so the trusted model (angles in fp64) trains the same at any offset. A
[batch, seq, heads, head_dim] kernel's table is one sequence's positions, shared by its batch, while every sequence
sits at its own offset: the kernel is called once per sequence (batch 1, that sequence's table), the longest
positions first, so that the fidelity check (which captures the first calls) sees the far end of the range. Giving
every sequence one offset would have kept one call, but trained a single window of positions, and not those of the
trusted model. Forward kernels; the backward is trusted.
"""

from __future__ import annotations

from typing import Any

import torch

from worker.canary.binding import CanaryUnsupported, Kernel, OpBinding, Site, SiteOptions
from worker.canary.families.common import (
    Arg,
    const,
    inputs,
    make,
    normal,
    outputs,
    scalar_roles,
    scalars,
    source,
    token_count,
)
from worker.canary.kernel_call import call
from worker.canary.ops import Ops, RopeLayout, rope_angles, rotate
from worker.canary.profiles import CanaryProfile
from worker.formats import Definition

SITE: Site = "rope"
THETAS = (10000.0, 500000.0, 1000000.0)  # common bases, tried where a definition fixes its own
K_WORDS = ("k", "key", "keys")
COS_WORDS = ("cos", "cosine")
SIN_WORDS = ("sin", "sine")
LAYOUTS: tuple[RopeLayout, ...] = ("neox", "interleaved")


def _tables(ins: list[Arg]) -> tuple[Arg, Arg] | None:
    """The cos and sin tables, found by name; None where no input is named either."""
    cos = [a for a in ins if a.named(*COS_WORDS)]
    sin = [a for a in ins if a.named(*SIN_WORDS)]
    if not cos and not sin:
        return None
    if len(cos) != 1 or len(sin) != 1 or cos[0] is sin[0]:
        raise CanaryUnsupported("a RoPE's tables are one input named cos and one named sin")
    c, s = cos[0], sin[0]
    if c.rank != 2 or not c.floating or not s.floating or c.axes != s.axes:
        raise CanaryUnsupported("a RoPE's cos and sin tables are float [seq, head_dim] (or [seq, head_dim/2]) alike")
    return c, s


def _position_roles(ins: list[Arg], heads: list[Arg]) -> dict[str, str]:
    roles = scalar_roles(SITE, ins, {"theta": ("theta", "base", "rope")})
    pos = [a for a in ins if a.rank == 1 and not a.floating]
    if (
        not 1 <= len(heads) <= 2
        or any(h.rank != 3 for h in heads)
        or len(pos) != 1
        or len(roles) + len(heads) + 1 != len(ins)
    ):
        raise CanaryUnsupported(
            "a RoPE takes q and k (or one tensor) as [tokens, heads, head_dim] and integer positions, "
            "or cos and sin tables"
        )
    if any(h.axes[0] != pos[0].axes[0] or h.axes[2] != heads[0].axes[2] for h in heads):
        raise CanaryUnsupported("q, k and positions must share the token axis, q and k the head dim")
    return {**roles, pos[0].name: "positions"}


def _table_roles(ins: list[Arg], heads: list[Arg], tables: tuple[Arg, Arg]) -> dict[str, str]:
    if scalars(ins) or not 1 <= len(heads) <= 2 or len(heads) + 2 != len(ins) or len({h.rank for h in heads}) != 1:
        raise CanaryUnsupported(
            "a RoPE given cos and sin tables takes q and k (or one tensor), as [tokens, heads, head_dim] or "
            "[batch, seq, heads, head_dim], and the two tables, nothing else"
        )
    first = heads[0]
    lead = first.axes[:-2]  # (tokens,) or (batch, seq)
    if any(h.axes[:-2] != lead or h.axes[-1] != first.axes[-1] for h in heads):
        raise CanaryUnsupported("q and k must share the token (or batch and sequence) axes and the head dim")
    if tables[0].axes[0] != lead[-1]:
        raise CanaryUnsupported("the cos and sin tables must have a row per token (or per position of the sequence)")
    return {tables[0].name: "cos", tables[1].name: "sin"}


def _roles(d: Definition) -> tuple[dict[str, str], dict[str, str]]:
    ins, outs = inputs(d), outputs(d)
    tables = _tables(ins)
    heads = [a for a in ins if a.rank in (3, 4) and a.floating]
    roles = _position_roles(ins, heads) if tables is None else _table_roles(ins, heads, tables)
    k_first = len(heads) == 2 and heads[0].named(*K_WORDS) and not heads[1].named(*K_WORDS)
    names = ["k", "q"] if k_first else ["q", "k"]
    roles.update({h.name: names[i] if len(heads) == 2 else "x" for i, h in enumerate(heads)})
    if len(outs) != len(heads) or any(o.axes != h.axes for o, h in zip(outs, heads)):
        raise CanaryUnsupported("a RoPE returns its rotated tensors, in the order of its inputs")
    return roles, {o.name: f"{roles[h.name]}_out" for o, h in zip(outs, heads)}


def bind(d: Definition, options: SiteOptions) -> OpBinding:
    ins, outs = _roles(d)
    return make(SITE, d, ins, outs, options)


def _half_widths(d: Definition, head_dim: str, columns: str) -> list[bool]:
    """Whether a table's columns may be one per pair (head_dim/2): where its axes leave it open, both, full first."""
    if columns == head_dim:
        return [False]
    dh, width = const(d, head_dim), const(d, columns)
    if dh is None or width is None:
        return [False, True]
    if width in (dh, dh // 2) and dh % 2 == 0:
        return [width != dh]
    raise CanaryUnsupported(f"cos and sin tables of {width} columns fit no head dim of {dh} (nor its half)")


def proposals(d: Definition) -> list[SiteOptions]:
    ins, _ = _roles(d)
    tables = _tables(inputs(d))
    if tables is not None:
        # the reference need not compute a cos or sin itself: what it does with the tables is checked by running it
        head = d.inputs[next(n for n, r in ins.items() if r in ("q", "x"))].shape or []
        halves = _half_widths(d, head[-1], tables[0].axes[1])
        return [SiteOptions(rope_layout=lay, rope_half_table=h) for h in halves for lay in LAYOUTS]
    text = source(d)
    if not ("cos" in text and "sin" in text):
        raise CanaryUnsupported("the reference computes no cos and sin")
    thetas: list[float | None] = [None] if "theta" in ins.values() else list(THETAS)
    return [SiteOptions(rope_layout=lay, rope_theta=t) for t in thetas for lay in LAYOUTS]


def _rank(b: OpBinding) -> int:
    spec = b.role_in("q") or b.role_in("x")
    assert spec is not None and spec.rank is not None
    return spec.rank


def _sequence_dims(d: Definition, batch: str, seq: str) -> dict[str, int]:
    """The canary's sequence length from a [batch, seq, heads, head_dim] form's constant seq axis; the kernel is
    called once per sequence, so a constant batch other than 1 fits no call of it."""
    if const(d, batch) not in (None, 1):
        raise CanaryUnsupported(
            f"a constant batch of {const(d, batch)}: the site calls a [batch, seq, heads, head_dim] RoPE once per "
            "sequence, each at its own positions"
        )
    n = const(d, seq)
    return {} if n is None else {"seq_len": n}


def dims(b: OpBinding, d: Definition, p: CanaryProfile) -> dict[str, int]:
    shapes = {s.role: d.inputs[s.name].shape or [] for s in b.inputs}
    q = shapes.get("q", shapes.get("x", []))
    out: dict[str, int] = {}
    heads, head_dim = const(d, q[-2]), const(d, q[-1])
    if head_dim is None and b.options.rope_half_table:
        width = const(d, shapes["cos"][1])
        head_dim = None if width is None else 2 * width
    if heads is not None:
        out["n_heads"] = heads
    kv = const(d, shapes["k"][-2]) if "k" in shapes else None
    if "k" in shapes and shapes["k"][-2] != q[-2]:
        out["n_kv_heads"] = kv if kv is not None else max(1, (heads or p.n_heads) // 2)  # kv heads of their own: GQA
    if head_dim is not None:
        out["d_model"] = head_dim * (heads or p.n_heads)
    if len(q) == 4:
        return {**out, **_sequence_dims(d, q[0], q[1])}
    return {**out, **token_count(p, const(d, q[0]))}


def _theta(b: OpBinding, p: CanaryProfile) -> float:
    return b.options.rope_theta if b.options.rope_theta is not None else p.rope_theta


def _widened(half: torch.Tensor, o: SiteOptions) -> torch.Tensor:
    """A [..., head_dim/2] table of the pairs' values as the definition's table lays it out."""
    if o.rope_half_table:
        return half
    if o.rope_layout == "neox":
        return torch.cat([half, half], dim=-1)
    return half.repeat_interleave(2, dim=-1)


def _per_pair(table: torch.Tensor, o: SiteOptions) -> torch.Tensor:
    """The [..., head_dim/2] values of a table laid out as `_widened` lays it out: one per rotated pair."""
    if o.rope_half_table:
        return table
    if o.rope_layout == "neox":
        return table[..., : table.shape[-1] // 2]
    return table[..., 0::2]


def tables(positions: torch.Tensor, head_dim: int, theta: float, o: SiteOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [..., width] at `positions` [...], in fp32 from fp64 angles: the rounding of the trusted
    op's own cos and sin (worker.canary.ops.rotate casts them to the fp32 activations), so an exact fp32 kernel
    trains as the trusted op, to the bit."""
    angles = rope_angles(positions, head_dim, theta)
    return _widened(torch.cos(angles).float(), o), _widened(torch.sin(angles).float(), o)


def example(b: OpBinding, p: CanaryProfile, gen: torch.Generator) -> dict[str, Any]:
    dh, n = p.d_model // p.n_heads, 8
    positions = torch.randint(0, p.rope_max_position, (n,), generator=gen)
    lead = (2, n) if _rank(b) == 4 else (n,)  # a [batch, seq, ...] form: two sequences sharing the table's rows
    q, k = normal((*lead, p.n_heads, dh), gen), normal((*lead, p.kv_heads, dh), gen)
    cos, sin = tables(positions, dh, _theta(b, p), b.options)
    return {"q": q, "k": k, "x": q, "positions": positions, "theta": _theta(b, p), "cos": cos, "sin": sin}


def expected(b: OpBinding, v: dict[str, Any]) -> dict[str, torch.Tensor]:
    """From tables, the rotation by the values they hold (as the definition's dtype rounded them); from positions,
    the trusted op's."""
    layout = b.options.rope_layout
    if b.role_in("cos") is None:
        q, k = Ops().rope(v["q"], v["k"], v["positions"], float(v["theta"]), layout)
    else:
        cos, sin = (_per_pair(v[r].float(), b.options) for r in ("cos", "sin"))
        q, k = rotate(v["q"], cos, sin, layout), rotate(v["k"], cos, sin, layout)
    return {"q_out": q, "k_out": k, "x_out": q}


def _rotated(
    b: OpBinding, kernel: Kernel, q: torch.Tensor, k: torch.Tensor, given: dict[str, Any]
) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k through the kernel, in one call or (a one-tensor kernel) one each; `given`: the positions and theta,
    or the tables."""
    if b.role_in("x") is not None:
        qo = call(b, kernel, {"x": q, **given}, {"x_out": tuple(q.shape)})["x_out"]
        ko = call(b, kernel, {"x": k, **given}, {"x_out": tuple(k.shape)})["x_out"]
        return qo, ko
    got = call(b, kernel, {"q": q, "k": k, **given}, {"q_out": tuple(q.shape), "k_out": tuple(k.shape)})
    return got["q_out"], got["k_out"]


def _tokens(t: torch.Tensor) -> torch.Tensor:
    """[batch, tokens, heads, head_dim] as [batch x tokens, heads, head_dim]."""
    return t.reshape(-1, *t.shape[-2:])


def _per_sequence(
    b: OpBinding, kernel: Kernel, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """A [batch, seq, heads, head_dim] kernel called on one sequence at a time with its own table, the longest
    positions (the last sequence's, worker.canary.forward.rope_positions) first."""
    cos, sin = tables(positions, q.shape[-1], theta, b.options)
    qs: list[torch.Tensor] = []
    ks: list[torch.Tensor] = []
    for i in reversed(range(q.shape[0])):
        qo, ko = _rotated(b, kernel, q[i : i + 1], k[i : i + 1], {"cos": cos[i], "sin": sin[i]})
        qs.insert(0, qo)
        ks.insert(0, ko)
    return torch.cat(qs), torch.cat(ks)


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, theta: float, b: OpBinding, kernel: Kernel
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(positions)
        ctx.theta, ctx.layout = theta, b.options.rope_layout
        if b.role_in("cos") is None:
            given: dict[str, Any] = {"positions": positions.reshape(-1), "theta": theta}
            qo, ko = _rotated(b, kernel, _tokens(q), _tokens(k), given)
        elif _rank(b) == 3:  # a row of the tables per token: every token at its own position, in one call
            cos, sin = tables(positions.reshape(-1), q.shape[-1], theta, b.options)
            qo, ko = _rotated(b, kernel, _tokens(q), _tokens(k), {"cos": cos, "sin": sin})
        else:
            qo, ko = _per_sequence(b, kernel, q, k, positions, theta)
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
