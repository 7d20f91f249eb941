"""Site "attention_decode": one decode step of (grouped-query) attention over a KV cache, at every layer.

Signatures: q as [batch, heads, head_dim] (one new token per sequence), k and v caches as [batch, slots, kv_heads,
head_dim] (flash_attn_with_kvcache's and FlashInfer's NHD layout) or [batch, kv_heads, slots, head_dim] (HND), settled
by running the reference; an integer [batch] tensor of each sequence's valid cache length; an optional scale scalar
that gets 1/sqrt(head_dim). Fewer key/value heads than query heads train grouped-query attention.

In the model, causal attention is computed as decode steps: every query position t of every sequence is one row of
the kernel's batch, whose cache holds the sequence's keys and values with length t + 1. A few kernel calls per layer
(positions grouped by length, `position_groups`) run the whole causal attention, and a kernel that reads past a row's
length sees the sequence's later tokens (as a real decode kernel reading stale slots would see garbage). The cache is
materialised per row: the price of a few calls instead of one per position. Forward kernels; the backward is the trusted
autograd of causal attention, which computes the same function.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from worker.canary.binding import CanaryUnsupported, Kernel, OpBinding, Site, SiteOptions
from worker.canary.families.common import const, head_dims, inputs, make, normal, outputs, require, scalar_roles
from worker.canary.kernel_call import call
from worker.canary.ops import Ops, attention_scale
from worker.canary.profiles import CanaryProfile
from worker.formats import Definition
from worker.numerics.dtypes import to_torch

SITE: Site = "attention_decode"
NAMES = {"q": ("q", "query", "queries"), "k": ("k", "key", "keys"), "v": ("v", "value", "values")}
LENGTH_WORDS = ("lens", "len", "lengths", "length", "seqlens", "seqlen")
# A decode bug whose error grows with the context (a running P @ V rounded to bf16 per cache slot) is 3.3x an ideal
# output's error over causal rows of up to 64 slots, under the fidelity limit of 4x, and 7.7-8.3x over this site's
# longest rows at 128 (benchmarks/results/canary_sites_decode_cpu.md): the site trains on sequences at least this
# long; a batch of them holds half the profile's tokens, as every token's attention here reads its own cache copy.
MIN_SEQ_LEN = 128
GROUPS = 4  # kernel calls per layer (position_groups)


def _roles(d: Definition) -> tuple[dict[str, str], dict[str, str]]:
    ins, outs = inputs(d), outputs(d)
    roles = scalar_roles(SITE, ins, {"scale": ("scale", "sm", "softmax")})
    q = [a for a in ins if a.rank == 3 and a.floating]
    kv = [a for a in ins if a.rank == 4 and a.floating]
    lens = [a for a in ins if a.rank == 1 and not a.floating]
    if len(q) != 1 or len(kv) != 2 or len(lens) != 1 or len(roles) + 4 != len(ins):
        raise CanaryUnsupported(
            "a decode attention takes q as a 3-D tensor, k and v caches as 4-D ones, each sequence's cache length "
            "as a 1-D integer tensor (and optionally a scale)"
        )
    if not lens[0].named(*LENGTH_WORDS) or lens[0].axes[0] != q[0].axes[0]:
        raise CanaryUnsupported("a decode attention's integer input must be the cache length of each sequence of q")
    named = {role: next((a for a in kv if a.named(*NAMES[role])), None) for role in ("k", "v")}
    k, v = (named["k"], named["v"]) if named["k"] is not None and named["v"] is not None else (kv[0], kv[1])
    roles.update({q[0].name: "q", k.name: "k", v.name: "v", lens[0].name: "kv_lens"})
    if len(outs) != 1 or outs[0].axes != q[0].axes:
        raise CanaryUnsupported("a decode attention returns one tensor of q's shape")
    return roles, {outs[0].name: "y"}


def bind(d: Definition, options: SiteOptions) -> OpBinding:
    ins, outs = _roles(d)
    return make(SITE, d, ins, outs, options)


def proposals(d: Definition) -> list[SiteOptions]:
    _roles(d)
    require(d, ("scaled_dot_product_attention", "softmax"), "softmax or scaled_dot_product_attention")
    # heads_first: the caches as [batch, kv_heads, slots, head_dim] (HND); False: [batch, slots, kv_heads, head_dim]
    return [SiteOptions(heads_first=False), SiteOptions(heads_first=True)]


def dims(b: OpBinding, d: Definition, p: CanaryProfile) -> dict[str, int]:
    shapes = {s.role: d.inputs[s.name].shape or [] for s in b.inputs}
    q, k = shapes["q"], shapes["k"]
    kv_heads_axis = k[1] if b.options.heads_first else k[2]
    slots_axis = k[2] if b.options.heads_first else k[1]
    fixed = [a for a in (q[0], slots_axis) if const(d, a) is not None]
    if fixed:  # the site's calls have as many rows and slots as the positions of a group (position_groups)
        raise CanaryUnsupported(f"the canary's decode rows need a variable batch and cache length; {fixed} are fixed")
    out = head_dims(d, p, q[1], kv_heads_axis, q[2], {})
    if p.seq_len < MIN_SEQ_LEN:
        out["seq_len"] = MIN_SEQ_LEN
        out["batch_size"] = max(1, p.batch_size * p.seq_len // MIN_SEQ_LEN // 2)
    return out


def decode_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    heads_first: bool,
    positions: tuple[int, int] | None = None,
    cache_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Causal attention's q [batch, heads, tokens, head_dim], k and v [batch, kv_heads, tokens, head_dim] as decode
    steps, for the query positions in [lo, hi) (`positions`; None: all): q [batch x positions, heads, head_dim]; the
    caches [batch x positions, hi, kv_heads, head_dim] (or, with `heads_first`, [batch x positions, kv_heads, hi,
    head_dim]), row (b, t) holding sequence b's first hi keys and values; the lengths [batch x positions] (t + 1).
    The caches are made in `cache_dtype` (the definition's) from the start, so that they are written once."""
    b, h, t, dh = q.shape
    lo, hi = positions or (0, t)
    rows = q[:, :, lo:hi].transpose(1, 2).reshape(b * (hi - lo), h, dh)

    def cache(z: torch.Tensor) -> torch.Tensor:
        z = z[:, :, :hi] if cache_dtype is None else z[:, :, :hi].to(cache_dtype)
        per_seq = z if heads_first else z.transpose(1, 2)  # [batch, kv_heads, hi, dh] or [batch, hi, kv_heads, dh]
        return per_seq.unsqueeze(1).expand(b, hi - lo, *per_seq.shape[1:]).reshape(b * (hi - lo), *per_seq.shape[1:])

    lens = torch.arange(lo + 1, hi + 1, device=q.device, dtype=torch.int32).repeat(b)
    return rows, cache(k), cache(v), lens


def position_groups(t: int) -> list[tuple[int, int]]:
    """The kernel's calls per layer: query positions [lo, hi) with a cache of hi slots, the longest first.

    Padding every row's cache to the sequence length would cost tokens^2 cache slots per sequence; GROUPS calls cost
    (GROUPS + 1) / (2 GROUPS) of that. The longest come first because the gradient-fidelity check reads a step's
    first calls (worker.canary.profiles: fidelity_calls_per_step), and a decode kernel's rounding shows most at its
    longest contexts."""
    bounds = sorted({round(t * i / GROUPS) for i in range(GROUPS + 1)})
    return [(lo, hi) for lo, hi in reversed(list(itertools.pairwise(bounds)))]


def example(b: OpBinding, p: CanaryProfile, gen: torch.Generator) -> dict[str, Any]:
    """Two short sequences' causal attention as decode rows: lengths 1 to 8, GQA when the profile has it."""
    dh, t = p.d_model // p.n_heads, 8
    q, k, v = (normal((2, n, t, dh), gen) for n in (p.n_heads, p.kv_heads, p.kv_heads))
    rows, kc, vc, lens = decode_rows(q, k, v, b.options.heads_first)
    return {"q": rows, "k": kc, "v": vc, "kv_lens": lens, "scale": attention_scale(dh)}


def expected(b: OpBinding, v: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The trusted causal attention of the sequences the rows came from (row (b, t) is query t of sequence b)."""
    q, k, val = v["q"], v["k"], v["v"]
    t = k.shape[2] if b.options.heads_first else k.shape[1]
    n, h, dh = q.shape
    seqs = n // t
    qs = q.reshape(seqs, t, h, dh).transpose(1, 2)
    # the caches of each sequence's last row hold all of its tokens
    last = torch.arange(seqs) * t + (t - 1)
    ks, vs = (z[last] if b.options.heads_first else z[last].transpose(1, 2) for z in (k, val))
    return {"y": Ops().attention(qs, ks, vs).transpose(1, 2).reshape(n, h, dh)}


class _Decode(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: OpBinding, kernel: Kernel
    ) -> torch.Tensor:
        ctx.save_for_backward(q, k, v)
        spec = b.role_in("k")
        dtype = to_torch(spec.dtype) if spec is not None else None
        bsz, h, t, dh = q.shape
        out = torch.empty_like(q)
        for lo, hi in position_groups(t):
            rows, kc, vc, lens = decode_rows(q, k, v, b.options.heads_first, (lo, hi), dtype)
            args = {"q": rows, "k": kc, "v": vc, "kv_lens": lens, "scale": attention_scale(dh)}
            y = call(b, kernel, args, {"y": tuple(rows.shape)})["y"]
            out[:, :, lo:hi] = y.reshape(bsz, hi - lo, h, dh).transpose(1, 2).to(q.dtype)
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(True) for t in ctx.saved_tensors]
            grads = torch.autograd.grad(Ops().attention(leaves[0], leaves[1], leaves[2]), leaves, g)
        return (*grads, None, None)


def apply(b: OpBinding, kernel: Kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [batch, heads, tokens, head_dim], k and v [batch, kv_heads, tokens, head_dim]: causal attention."""
    return _Decode.apply(q, k, v, b, kernel)  # type: ignore[no-any-return]
