"""The newer canary sites, one module per family of ops: linear (GEMM forward and backward), glu (SwiGLU/GeGLU, with
or without the projections), add_norm (residual add + RMSNorm, pre- and post-norm), softmax (attention scores),
rope (rotary embedding of q and k), attention (causal scaled-dot-product attention), decode (causal attention
computed as one decode step per position, over a KV cache) and moe_routing (an MoE router's top-k experts and their
weights).

Each module says, for its site: which role every argument of a definition plays (`bind`), which layouts a signature
could mean (`proposals`, raising CanaryUnsupported with the reason where it fits none), which canary sizes the
definition's constant axes fix (`dims`), a small example of the op's arguments by role (`example`) and the trusted
outputs for them (`expected`: worker.canary.matching runs the reference on the example to confirm a layout), and the
autograd Function that calls the kernel in the model (`apply`, used by worker.canary.sites.KernelOps).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from worker.canary.binding import OpBinding, Site, SiteOptions
from worker.canary.families import add_norm, attention, decode, glu, linear, moe, rope, softmax
from worker.canary.profiles import CanaryProfile
from worker.formats import Definition


class Family(Protocol):
    SITE: Site

    def bind(self, d: Definition, options: SiteOptions) -> OpBinding: ...

    def proposals(self, d: Definition) -> list[SiteOptions]: ...

    def dims(self, b: OpBinding, d: Definition, p: CanaryProfile) -> dict[str, int]: ...

    def example(self, b: OpBinding, p: CanaryProfile, gen: torch.Generator) -> dict[str, Any]: ...

    def expected(self, b: OpBinding, values: dict[str, Any]) -> dict[str, torch.Tensor]: ...


# in the order matching tries them
FAMILIES: dict[Site, Family] = {m.SITE: m for m in (linear, glu, add_norm, softmax, rope, attention, decode, moe)}


def bind_family(site: Site, d: Definition, options: SiteOptions) -> OpBinding:
    return FAMILIES[site].bind(d, options)
