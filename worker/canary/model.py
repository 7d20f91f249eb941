"""A small decoder-only transformer (RMSNorm, causal attention, MLP, untied head).

Every place an audited op can sit goes through `Ops`: the plain PyTorch ops here are the
trusted ones (used for held-out evaluation); worker.canary.sites swaps one of them for a kernel.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from worker.canary.binding import Site
from worker.canary.profiles import CanaryProfile


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype)


class Ops:
    """The trusted PyTorch ops."""

    def embed(self, ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, table)

    def embed_norm(self, ids: torch.Tensor, table: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rmsnorm(F.embedding(ids, table), weight, eps)

    def norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rmsnorm(x, weight, eps)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), targets)


class Block(nn.Module):
    def __init__(self, p: CanaryProfile) -> None:
        super().__init__()
        d = p.d_model
        self.n_heads = p.n_heads
        self.norm1 = nn.Parameter(torch.ones(d))
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.norm2 = nn.Parameter(torch.ones(d))
        self.fc1 = nn.Linear(d, p.d_ff, bias=False)
        self.fc2 = nn.Linear(p.d_ff, d, bias=False)

    def forward(self, h: torch.Tensor, ops: Ops, eps: float) -> torch.Tensor:
        b, t, d = h.shape
        q, k, v = self.qkv(ops.norm(h, self.norm1, eps)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return h + self.fc2(F.gelu(self.fc1(ops.norm(h, self.norm2, eps))))


class TinyDecoder(nn.Module):
    def __init__(self, p: CanaryProfile, site: Site) -> None:
        super().__init__()
        self.eps = p.norm_eps
        self.site = site
        self.tok_emb = nn.Parameter(torch.empty(p.vocab_size, p.d_model))
        # the fused embedding+RMSNorm site needs a norm right after the embedding
        self.emb_norm = nn.Parameter(torch.ones(p.d_model)) if site == "embedding_norm" else None
        self.blocks = nn.ModuleList(Block(p) for _ in range(p.n_layers))
        self.final_norm = nn.Parameter(torch.ones(p.d_model))
        self.head = nn.Linear(p.d_model, p.vocab_size, bias=False)

    def forward(self, ids: torch.Tensor, ops: Ops) -> torch.Tensor:
        if self.emb_norm is not None:
            h = ops.embed_norm(ids, self.tok_emb, self.emb_norm, self.eps)
        else:
            h = ops.embed(ids, self.tok_emb)
        for blk in self.blocks:
            h = blk(h, ops, self.eps)
        return self.head(ops.norm(h, self.final_norm, self.eps))

    def loss(self, seq: torch.Tensor, ops: Ops) -> torch.Tensor:
        """seq: [batch, T+1] token ids; next-token cross entropy over T positions."""
        ids, targets = seq[:, :-1], seq[:, 1:]
        logits = self(ids, ops)
        return ops.loss(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def init_state(p: CanaryProfile, site: Site, seed: int) -> dict[str, torch.Tensor]:
    """Deterministic initial weights (drawn on the CPU, so every device starts from the same bits)."""
    gen = torch.Generator().manual_seed(seed)
    model = TinyDecoder(p, site)
    state: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        if t.dim() == 1:
            state[name] = torch.ones_like(t)
        elif name == "tok_emb":
            state[name] = torch.randn(t.shape, generator=gen) * 0.02
        else:
            std = 0.02 / math.sqrt(2 * p.n_layers) if name.endswith(("proj.weight", "fc2.weight")) else 0.02
            state[name] = torch.randn(t.shape, generator=gen) * std
    return state


def build(p: CanaryProfile, site: Site, state: dict[str, torch.Tensor], device: torch.device | str) -> TinyDecoder:
    """The model with exactly these weights on `device`. Made on the meta device and then given the weights: its own
    random initialisation (11M parameters on the CPU for the GPU profile) would be thrown away, and a held-out
    evaluation builds one model per checkpoint and run."""
    with torch.device("meta"):
        model = TinyDecoder(p, site)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state.items()}
    if set(expected) != set(got) or any(tuple(expected[k]) != got[k] for k in expected):
        raise ValueError("weights do not match the canary model's parameters")
    model = model.to_empty(device=device)  # the model has no buffers: every tensor is a parameter, set just below
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return model
