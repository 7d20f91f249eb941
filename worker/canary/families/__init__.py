"""The canary sites a definition can be matched to from its signature, one module per family of ops: linear (GEMM
forward and backward), glu (SwiGLU/GeGLU, with or without the projections), add_norm (residual add + RMSNorm, pre- and
post-norm, or OLMo's RMSNorm then residual add), norm (RMSNorm forward or backward: one of the original sites, as
common among uncurated definitions as any newer one), softmax (attention scores), rope (rotary embedding of q and k),
attention (causal scaled-dot-product attention), decode (causal attention computed as one decode step per position,
over a KV cache), moe_routing (an MoE router's top-k experts and their weights), and the other original sites:
embedding_norm (the backward of an embedding lookup and the RMSNorm after it), embedding (the embedding table's
gradient) and loss (cross entropy), so that the kernels training breaks on first (an embedding gradient accumulated in
bf16) get a canary uncurated too.

Each module says, for its site: which role every argument of a definition plays (`bind`), which layouts a signature
could mean (`proposals`, raising CanaryUnsupported with the reason where it fits none), which canary sizes the
definition's constant axes fix (`dims`), a small example of the op's arguments by role (`example`) and the trusted
outputs for them (`expected`: worker.canary.matching runs the reference on the example to confirm a layout), and the
autograd Function that calls the kernel in the model (`apply`, used by worker.canary.sites.KernelOps). The original
sites' families have none: their bindings are the original roles, and they train through the original sites'
Functions in worker.canary.sites (_Norm, _Embedding, _EmbeddingNorm, _Loss), so that a matched op trains as one
audit.json names.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from worker.canary.binding import OpBinding, Site, SiteOptions
from worker.canary.families import (
    add_norm,
    attention,
    decode,
    embedding,
    embedding_norm,
    glu,
    linear,
    loss,
    moe,
    norm,
    rope,
    softmax,
)
from worker.canary.profiles import CanaryProfile
from worker.formats import Definition


class Family(Protocol):
    SITE: Site

    def bind(self, d: Definition, options: SiteOptions) -> OpBinding: ...

    def proposals(self, d: Definition) -> list[SiteOptions]: ...

    def dims(self, b: OpBinding, d: Definition, p: CanaryProfile) -> dict[str, int]: ...

    def example(self, b: OpBinding, p: CanaryProfile, gen: torch.Generator) -> dict[str, Any]: ...

    def expected(self, b: OpBinding, values: dict[str, Any]) -> dict[str, torch.Tensor]: ...


# in the order matching tries them: add_norm before norm, so that a residual add + RMSNorm is taken for the fused op
# (embedding_norm before embedding likewise); the sites that take ids last, after every site a definition matched
# before they had families, so that none of those changes its site
FAMILIES: dict[Site, Family] = {
    m.SITE: m
    for m in (linear, glu, add_norm, norm, softmax, rope, attention, decode, moe, embedding_norm, embedding, loss)
}


def bind_family(site: Site, d: Definition, options: SiteOptions) -> OpBinding:
    return FAMILIES[site].bind(d, options)
