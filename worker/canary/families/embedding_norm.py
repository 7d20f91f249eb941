"""Site "embedding_norm": the backward of an embedding lookup fused with the RMSNorm after it, y = rmsnorm(table[ids],
weight, eps), one of the original sites, here matched from a definition's signature and confirmed by its reference.

Signature: ids [tokens], grad_output [tokens, hidden], the norm's weight [hidden], the table [vocab, hidden] or its
rows x [tokens, hidden], maybe rstd per token, eps, num_embeddings and padding_idx -> the table's gradient [vocab,
hidden] and maybe the weight's [hidden]. The roles are the original site's (worker.canary.binding.bind), so a matched
definition trains as one whose audit.json names the site, through worker.canary.sites._EmbeddingNorm. The example is
the embedding site's (repeated ids: the per-token gradients must be added per row) on table rows the norm site's
example holds (rows on an offset, which a LayerNorm would centre; rows below eps, where eps must be inside the root).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from worker.canary.binding import OpBinding, Site, SiteOptions
from worker.canary.families.common import normal
from worker.canary.families.embedding import (
    ID_PATTERN,
    bind_table_grad,
    example_ids,
    table_dims,
    table_grad,
    table_grad_shapes,
)
from worker.canary.families.norm import rms_proposals, rstd, rstd_for
from worker.canary.ops import rmsnorm
from worker.canary.profiles import CanaryProfile
from worker.formats import Definition
from worker.numerics.dtypes import to_torch

SITE: Site = "embedding_norm"
# the inputs worker.canary.sites._EmbeddingNorm hands the kernel
GIVEN = ("ids", "grad_output", "x", "table", "norm_weight", "rstd", "eps", "num_embeddings", "padding_idx")


def bind(d: Definition, options: SiteOptions) -> OpBinding:
    return bind_table_grad(SITE, d, GIVEN, "the fused embedding + RMSNorm backward")


def proposals(d: Definition) -> list[SiteOptions]:
    return rms_proposals(bind(d, SiteOptions()), d)


def dims(b: OpBinding, d: Definition, p: CanaryProfile) -> dict[str, int]:
    return table_dims(d, p, *table_grad_shapes(b, d))


def _table(b: OpBinding, p: CanaryProfile, ids: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A table whose looked-up rows are plain, on an offset and (where the definition takes eps) below eps, in the
    dtype the definition reads them in, so that x, rstd and the table agree with what the reference receives."""
    spec = b.role_in("table") or b.role_in("x")
    rows = ids.unique()  # sorted: row 0 of them is plain, 1 on an offset, 2 below eps, 3 on a negative offset
    low = 0.1 * math.sqrt(p.norm_eps) if b.role_in("eps") is not None else 1.0
    t = normal((p.vocab_size, p.d_model), gen)
    t[rows] = t[rows] * torch.tensor([1.0, 1.0, low, 1.0])[:, None] + torch.tensor([0.0, 2.0, 0.0, -2.0])[:, None]
    return t.to(to_torch(spec.dtype)).float() if spec is not None else t


def example(b: OpBinding, p: CanaryProfile, gen: torch.Generator) -> dict[str, Any]:
    v = example_ids(b, p, gen)
    table = _table(b, p, v["ids"], gen)
    x = table[v["ids"]]
    return {
        **v,
        "table": table,
        "x": x,
        "norm_weight": 1.0 + normal((p.d_model,), gen, 0.1),
        "grad_output": normal((len(ID_PATTERN), p.d_model), gen),
        "rstd": rstd_for(b, rstd(x, p.norm_eps)),
        "eps": p.norm_eps,
    }


def expected(b: OpBinding, v: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The gradients of the looked-up rows and the weight by autograd of the fp64 RMSNorm, the rows' added up per id
    into the table's."""
    with torch.enable_grad():
        x = v["table"][v["ids"].long()].double().requires_grad_(True)
        w = v["norm_weight"].double().requires_grad_(True)
        gx, gw = torch.autograd.grad(rmsnorm(x, w, v["eps"]), (x, w), v["grad_output"].double())
    return {"grad_table": table_grad(v["ids"], gx, v["num_embeddings"], v["padding_idx"]), "grad_norm_weight": gw}
