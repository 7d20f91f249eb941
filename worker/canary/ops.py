"""The trusted PyTorch ops of the canary's model: every place an audited op can sit.

worker.canary.sites.KernelOps swaps one of them for a kernel. They are written to broadcast over leading axes, so
that worker.canary.forward can run them once for K stacked members (weights [K, ...], activations [K, ...]) as well
as on one member's tensors. The held-out evaluation runs exactly these.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F

Act = Literal["none", "gelu", "gelu_tanh", "silu", "relu"]
RopeLayout = Literal["neox", "interleaved"]


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype)


def layernorm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm over the last axis, in fp32, back in x's dtype."""
    y = F.layer_norm(x.float(), (x.shape[-1],), weight.float(), bias.float(), eps)
    return y.to(x.dtype)


def activation(x: torch.Tensor, act: Act) -> torch.Tensor:
    if act == "gelu":
        return F.gelu(x)
    if act == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if act == "silu":
        return F.silu(x)
    if act == "relu":
        return F.relu(x)
    return x


def matmul_t(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., in] times w [..., out, in] transposed: one member's F.linear, or K members' batched matmul."""
    if w.dim() == 2:
        return F.linear(x, w)
    k = x.shape[0]
    y = torch.matmul(x.reshape(k, -1, x.shape[-1]), w.transpose(1, 2))
    return y.reshape(*x.shape[:-1], w.shape[1])


def rope_angles(positions: torch.Tensor, head_dim: int, theta: float) -> torch.Tensor:
    """[..., head_dim/2] rotation angles, computed in fp64: exact to far beyond the canary's positions."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim))
    return positions.to(torch.float64)[..., None] * inv_freq


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: RopeLayout) -> torch.Tensor:
    """x [..., heads, head_dim] rotated by cos/sin [..., head_dim/2] (broadcast over the heads axis)."""
    c, s = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
    if layout == "neox":  # the head dim is [first half | second half]
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]  # GPT-J: (even, odd) pairs
    return torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).flatten(-2)


class Ops:
    """The trusted ops (fp32 arithmetic on the model's fp32 tensors)."""

    def embed(self, ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, table)

    def embed_norm(self, ids: torch.Tensor, table: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rmsnorm(F.embedding(ids, table), weight, eps)

    def norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rmsnorm(x, weight, eps)

    def layer_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """A LayerNorm of the model, whose norms have no bias: the norm site's LayerNorm variant."""
        return layernorm(x, weight, torch.zeros_like(weight), eps)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), targets)

    def linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, act: Act) -> torch.Tensor:
        """act(x @ w^T + b): one of the MLP's projections."""
        y = matmul_t(x, w)
        return activation(y if b is None else y + b, act)

    def linear_residual(
        self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, residual: torch.Tensor
    ) -> torch.Tensor:
        """residual + x @ w^T + b: the down-projection with its block's skip connection."""
        return residual + self.linear(x, w, b, "none")

    def glu(self, x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, act: Act) -> torch.Tensor:
        """act(x @ w_gate^T) * (x @ w_up^T): a gated MLP's first half."""
        return activation(matmul_t(x, w_gate), act) * matmul_t(x, w_up)

    def add_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(rmsnorm(residual + x), residual + x): a residual add and the norm after it."""
        s = residual + x
        return self.norm(s, weight, eps), s

    def norm_add(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """residual + rmsnorm(x): a sublayer's output normalised, then added to the residual stream (OLMo 2/3)."""
        return residual + self.norm(x, weight, eps)

    def softmax(self, scores: torch.Tensor) -> torch.Tensor:
        """Over the last axis (attention scores: [..., queries, keys], masked keys at -inf)."""
        return torch.softmax(scores.float(), dim=-1).to(scores.dtype)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal softmax(q k^T / sqrt(head_dim)) v; q [..., heads, tokens, head_dim], k and v [..., kv_heads, ...]
        (grouped-query attention: each key/value head serves heads / kv_heads query heads)."""
        if k.shape[-3] != q.shape[-3]:
            k, v = (z.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3) for z in (k, v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def moe_route(self, logits: torch.Tensor, k: int, renorm: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """An MoE router's top-k: (weights, expert ids), each [..., k], from logits [..., experts]. The k most probable
        experts in descending probability, a lower id first among equal ones (a stable sort); the gradient reaches
        the logits through the weights (route_weights) at the ids picked."""
        probs = torch.softmax(logits.detach().float(), dim=-1)
        ids = torch.sort(probs, dim=-1, descending=True, stable=True)[1][..., :k]
        return route_weights(logits, ids, renorm), ids

    def attention_decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The same causal attention, where a site computes it as one decode step per query position (each over the
        keys and values up to it): the trusted op is `attention`'s."""
        return self.attention(q, k, v)

    def rope(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, theta: float, layout: RopeLayout
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q [..., tokens, q_heads, head_dim] and k [..., tokens, kv_heads, head_dim] rotated by their positions
        [..., tokens]."""
        angles = rope_angles(positions, q.shape[-1], theta)
        cos, sin = torch.cos(angles), torch.sin(angles)
        return rotate(q, cos, sin, layout), rotate(k, cos, sin, layout)


def route_weights(logits: torch.Tensor, ids: torch.Tensor, renorm: bool) -> torch.Tensor:
    """The routing weights of the experts `ids` [..., k] picked from `logits` [..., experts]: their softmax
    probabilities, renormalised over the k (then the softmax of their logits alone) where `renorm`."""
    probs = torch.softmax(logits.float(), dim=-1).gather(-1, ids)
    return probs / probs.sum(-1, keepdim=True) if renorm else probs


def causal_mask(t: int, device: torch.device) -> torch.Tensor:
    """True above the diagonal: the keys a query may not see."""
    return torch.ones(t, t, dtype=torch.bool, device=device).triu(1)


def attention_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
