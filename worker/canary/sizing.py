"""The canary model at a definition's constant sizes.

A kernel built for fixed sizes (a GEMM with in_features = 4096, a RoPE with head_dim = 128) can only run at them, so
the canary's model takes them (d_model, d_ff, heads, sequence length, batch): larger or smaller than the profile's
own. The rest of the profile stays, but for depth: a model past the profile's max_params at those sizes loses layers,
down to one, until it fits. A size that makes no consistent model, or one layer still past max_params, is a reason
the op fits no canary here (CanaryUnsupported), reported as such.

A model wider than the profile's trains with AdamW's learning rate scaled down by the width's ratio (muP's rule for
Adam's hidden matrices, whose updates grow with fan-in at a fixed rate). At the profile's rate, SOL-ExecBench's RMSNorm
at hidden size 4096 (16x the GPU profile's width, 436M parameters) trained to a held-out loss 2.87 nats away from its
own reference rerun's (H100, 2026-12-07): a loss gap there says nothing about a kernel.
"""

from __future__ import annotations

import math

from worker.canary.binding import CanaryUnsupported, OpBinding
from worker.canary.model import param_shapes
from worker.canary.profiles import CanaryProfile


def _heads(p: CanaryProfile, fixed: bool) -> int:
    """The profile's head count, or the nearest one below it that divides d_model (where no definition fixed it)."""
    if p.d_model % p.n_heads == 0:
        return p.n_heads
    if fixed:
        raise CanaryUnsupported(f"d_model {p.d_model} is not a multiple of the definition's {p.n_heads} heads")
    return next(h for h in range(p.n_heads, 0, -1) if p.d_model % h == 0)


def sized(p: CanaryProfile, updates: dict[str, int], binding: OpBinding) -> CanaryProfile:
    """`p` with the definition's sizes (`updates`: profile field -> value), checked."""
    if not updates:
        return p
    bad = {k: v for k, v in updates.items() if v < 1}
    if bad:
        raise CanaryUnsupported(f"sizes {bad} make no model")
    q = p.model_copy(update=updates)
    q = q.model_copy(update={"n_heads": _heads(q, "n_heads" in updates)})
    if q.n_heads % q.kv_heads:
        raise CanaryUnsupported(f"{q.n_heads} query heads are no multiple of {q.kv_heads} key/value heads")
    if binding.site == "rope" and (q.d_model // q.n_heads) % 2:
        raise CanaryUnsupported(f"a head dim of {q.d_model // q.n_heads} is odd: RoPE rotates pairs")
    n = n_params(q, binding)
    # a model too large at the definition's width is made shallower, never narrower: the width is the op's, and
    # one layer still puts the kernel at every step of the training
    while n > q.max_params and q.n_layers > 1:
        q = q.model_copy(update={"n_layers": q.n_layers - 1})
        n = n_params(q, binding)
    if n > q.max_params:
        raise CanaryUnsupported(
            f"at the definition's constant sizes ({', '.join(f'{k}={v}' for k, v in sorted(updates.items()))}) the "
            f"canary model has {n / 1e6:.1f}M parameters with one layer, past the {q.name} profile's "
            f"{q.max_params / 1e6:g}M"
        )
    if q.d_model > p.d_model:
        q = q.model_copy(update={"adamw_lr": p.adamw_lr * p.d_model / q.d_model})
    return q


def n_params(p: CanaryProfile, binding: OpBinding) -> int:
    return sum(math.prod(shape) for _, shape in param_shapes(p, binding))
