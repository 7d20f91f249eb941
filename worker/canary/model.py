"""A small decoder-only transformer (RMSNorm, causal attention, MLP, untied head): its parameters, their initial
values, and the module that holds them.

Every place an audited op can sit goes through `Ops` (worker.canary.ops): the plain PyTorch ops are the trusted
ones (used for held-out evaluation); worker.canary.sites swaps one of them for a kernel. Which variant of the model a
site trains (a gated MLP, RoPE, ...) is its `Arch` (worker.canary.arch); the arithmetic is worker.canary.forward's,
shared with the stacked training.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from worker.canary.arch import Arch, arch_of
from worker.canary.binding import OpBinding, Site
from worker.canary.forward import Decoder
from worker.canary.ops import Ops, rmsnorm
from worker.canary.profiles import CanaryProfile

__all__ = ["Ops", "TinyDecoder", "build", "init_state", "param_shapes", "rmsnorm"]

Shape = tuple[int, ...]


def _arch(site: Arch | Site | OpBinding) -> Arch:
    return site if isinstance(site, Arch) else arch_of(site)


def _block_shapes(p: CanaryProfile, a: Arch) -> list[tuple[str, Shape]]:
    d, f = p.d_model, p.d_ff
    dh = d // p.n_heads
    shapes: list[tuple[str, Shape]] = [
        ("norm1", (d,)),
        ("qkv.weight", ((p.n_heads + 2 * p.kv_heads) * dh, d)),
        ("proj.weight", (d, d)),
        ("norm2", (d,)),
    ]
    if a.mlp == "glu":
        return [*shapes, ("gate.weight", (f, d)), ("up.weight", (f, d)), ("fc2.weight", (d, f))]
    if a.mlp == "moe":  # per expert a GELU MLP of d_expert (d_ff split among them), stacked on a leading axis
        e, fe = p.n_experts, p.d_expert
        return [
            *shapes,
            ("router.weight", (e, d)),
            ("expert_fc1.weight", (e, fe, d)),
            ("expert_fc2.weight", (e, d, fe)),
        ]
    shapes.append(("fc1.weight", (f, d)))
    if a.mlp_bias:
        shapes.append(("fc1.bias", (f,)))
    shapes.append(("fc2.weight", (d, f)))
    if a.mlp_bias:
        shapes.append(("fc2.bias", (d,)))
    return shapes


def param_shapes(p: CanaryProfile, site: Arch | Site | OpBinding) -> list[tuple[str, Shape]]:
    """Every parameter's name and shape, in the order the module lists them (gradient clipping sums in it)."""
    a = _arch(site)
    out: list[tuple[str, Shape]] = [("tok_emb", (p.vocab_size, p.d_model))]
    if a.emb_norm:  # the fused embedding+RMSNorm site needs a norm right after the embedding
        out.append(("emb_norm", (p.d_model,)))
    # post-norm's last block already ends in a norm; pre-norm's and OLMo's norm-then-add stream reach the head through
    # one (worker.canary.forward)
    if not a.post_norm:
        out.append(("final_norm", (p.d_model,)))
    for i in range(p.n_layers):
        out += [(f"blocks.{i}.{name}", shape) for name, shape in _block_shapes(p, a)]
    return [*out, ("head.weight", (p.vocab_size, p.d_model))]


class TinyDecoder(nn.Module):
    """The parameters, as a module (state_dict, optimisers, clipping); forward is worker.canary.forward's with K = 1."""

    def __init__(self, p: CanaryProfile, site: Arch | Site | OpBinding) -> None:
        super().__init__()
        self.p, self.arch = p, _arch(site)
        for name, shape in param_shapes(p, self.arch):
            *path, leaf = name.split(".")
            owner: nn.Module = self
            for part in path:
                if part not in owner._modules:
                    owner.add_module(part, nn.Module())
                owner = owner._modules[part]  # type: ignore[assignment]
            owner.register_parameter(leaf, nn.Parameter(torch.empty(shape)))

    def _decoder(self, ops: Ops) -> Decoder:
        return Decoder(self.p, self.arch, [ops], {name: t.unsqueeze(0) for name, t in self.named_parameters()})

    def forward(self, ids: torch.Tensor, ops: Ops) -> torch.Tensor:
        return self._decoder(ops).logits(ids)[0]

    def loss(self, seq: torch.Tensor, ops: Ops) -> torch.Tensor:
        """seq: [batch, T+1] token ids; next-token cross entropy over T positions."""
        return self._decoder(ops).losses(seq)[0]


def init_state(p: CanaryProfile, site: Arch | Site | OpBinding, seed: int) -> dict[str, torch.Tensor]:
    """Deterministic initial weights (drawn on the CPU, so every device starts from the same bits)."""
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name, shape in param_shapes(p, site):
        if len(shape) == 1:  # norm weights start at one, biases at zero
            state[name] = torch.zeros(shape) if name.endswith(".bias") else torch.ones(shape)
        elif name == "tok_emb":
            state[name] = torch.randn(shape, generator=gen) * 0.02
        else:
            std = 0.02 / math.sqrt(2 * p.n_layers) if name.endswith(("proj.weight", "fc2.weight")) else 0.02
            state[name] = torch.randn(shape, generator=gen) * std
    return {name: state[name] for name, _ in _module_order(p, site)}


def _module_order(p: CanaryProfile, site: Arch | Site | OpBinding) -> list[tuple[str, Shape]]:
    with torch.device("meta"):
        return [(name, tuple(t.shape)) for name, t in TinyDecoder(p, site).state_dict().items()]


def build(
    p: CanaryProfile, site: Arch | Site | OpBinding, state: dict[str, torch.Tensor], device: torch.device | str
) -> TinyDecoder:
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
