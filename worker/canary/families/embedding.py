"""Site "embedding": the embedding table's gradient, grad_table[v] = sum of grad_output[t] over the tokens t whose id
is v, one of the original sites, here matched from a definition's signature and confirmed by its reference.

Signature: ids [tokens] (integer), grad_output [tokens, hidden], maybe num_embeddings and padding_idx (scalars) ->
grad_table [vocab, hidden]. The roles are the original site's (worker.canary.binding.bind), so a matched definition
trains exactly as one whose audit.json names the site, through worker.canary.sites._Embedding. The example's ids repeat
(a scatter that writes instead of adding, or a mean per id, is far off where rows collect several tokens) and, where
the definition takes padding_idx, one repeated id is the padding row, whose gradient torch's embedding keeps at zero.
"""

from __future__ import annotations

from typing import Any

import torch

from worker.canary.binding import CanaryUnsupported, OpBinding, Site, SiteOptions
from worker.canary.binding import bind as bind_original
from worker.canary.families.common import const, inputs, normal, outputs, site_gives, tensors, token_count
from worker.canary.profiles import CanaryProfile
from worker.formats import Definition

SITE: Site = "embedding"
# the inputs worker.canary.sites._Embedding hands the kernel: a definition that needs any other cannot run there
GIVEN = ("ids", "grad_output", "num_embeddings", "padding_idx")
# the example's ids, as positions in ROWS: row 0 collects five tokens, rows 1 and 2 three, row 3 one
ID_PATTERN = (0, 1, 0, 2, 0, 1, 3, 0, 2, 1, 0, 2)
ROWS = 4


def lookup_refused(d: Definition) -> None:
    """Refuses an op that returns a table's rows per token (a lookup, the embedding's forward): the site's op is the
    table's gradient, one row per table entry. Its roles would say only that grad_output is missing."""
    ids = next((a.axes for a in inputs(d) if a.rank == 1 and not a.floating), None)
    tables = [a.axes[1:] for a in tensors(inputs(d)) if ids is not None and a.rank == 2 and a.axes[:1] != ids]
    rows = [a.name for a in tensors(outputs(d)) if a.rank == 2 and a.axes[:1] == ids and a.axes[1:] in tables]
    if ids is not None and rows:
        raise CanaryUnsupported(
            f"{', '.join(rows)} holds a table's row per token id ([{ids[0]}, ...]): a lookup, the embedding's "
            "forward; the site's op is the table's gradient, a row per table entry"
        )


def table_grad_shapes(b: OpBinding, d: Definition) -> tuple[str, str, str]:
    """(tokens, vocab, hidden) axes, where ids are [tokens], grad_output (and x) [tokens, hidden], the table and its
    gradient [vocab, hidden] and a norm weight [hidden]: the shapes the embedding sites hand the kernel."""
    axes = {s.role: tuple(d.inputs[s.name].shape or ()) for s in b.inputs if s.rank is not None}
    axes |= {"out_" + s.role: tuple(d.outputs[s.name].shape or ()) for s in b.outputs}
    g, gt = axes["grad_output"], axes["out_grad_table"]
    if len(axes["ids"]) != 1 or len(g) != 2 or len(gt) != 2 or g[:1] != axes["ids"] or gt[1:] != g[1:] or gt == g:
        raise CanaryUnsupported(
            "an embedding's gradient takes ids [tokens] and grad_output [tokens, hidden] and returns the table's "
            "gradient [vocab, hidden]"
        )
    want = {"x": g, "table": gt, "norm_weight": g[1:], "rstd": g[:1], "out_grad_norm_weight": g[1:]}
    bad = [r for r, a in want.items() if r in axes and axes[r][: len(a)] != a]
    if bad:
        raise CanaryUnsupported(f"the embedding's {', '.join(bad)} are not of the table's or the tokens' shapes")
    return g[0], gt[0], g[1]


def bind_table_grad(site: Site, d: Definition, given: tuple[str, ...], op: str) -> OpBinding:
    """The original site's roles (so that the binding trains as one audit.json names), for an op that returns the
    table's gradient from the arguments the site gives (`given`)."""
    lookup_refused(d)
    b = bind_original(site, d)
    site_gives(b, given, op)
    table_grad_shapes(b, d)
    return b


def bind(d: Definition, options: SiteOptions) -> OpBinding:
    return bind_table_grad(SITE, d, GIVEN, "the embedding's backward")


def proposals(d: Definition) -> list[SiteOptions]:
    bind(d, SiteOptions())
    return [SiteOptions()]


def dims(b: OpBinding, d: Definition, p: CanaryProfile) -> dict[str, int]:
    tokens, vocab, hidden = table_grad_shapes(b, d)
    return table_dims(d, p, tokens, vocab, hidden)


def table_dims(d: Definition, p: CanaryProfile, tokens: str, vocab: str, hidden: str) -> dict[str, int]:
    """d_model from a constant hidden axis, the batch from a constant token count; the table's rows are the canary
    text's vocabulary, which a definition cannot move (the text is tokenised at the profile's size)."""
    if const(d, vocab) not in (None, p.vocab_size):
        raise CanaryUnsupported(
            f"the definition fixes {vocab} = {const(d, vocab)}; the canary's text has {p.vocab_size} token ids"
        )
    out = {"d_model": const(d, hidden)} if const(d, hidden) is not None else {}
    return {**out, **token_count(p, const(d, tokens))}  # type: ignore[dict-item]


def example_ids(b: OpBinding, p: CanaryProfile, gen: torch.Generator) -> dict[str, Any]:
    """Repeated ids over ROWS rows of the table (and num_embeddings, padding_idx): where the definition takes a
    padding_idx, it is a row three tokens look up."""
    rows = torch.randperm(p.vocab_size, generator=gen)[:ROWS]
    pad = int(rows[1]) if b.role_in("padding_idx") is not None else -1
    return {"ids": rows[list(ID_PATTERN)], "num_embeddings": p.vocab_size, "padding_idx": pad}


def table_grad(ids: torch.Tensor, g: torch.Tensor, vocab: int, padding_idx: int) -> torch.Tensor:
    """The table's gradient in fp64: grad_output's rows added up per id, the padding row (where >= 0) left at zero,
    as torch's embedding does."""
    out = torch.zeros(vocab, g.shape[-1], dtype=torch.float64).index_add_(0, ids.long(), g.double())
    if padding_idx >= 0:
        out[padding_idx] = 0
    return out


def example(b: OpBinding, p: CanaryProfile, gen: torch.Generator) -> dict[str, Any]:
    v = example_ids(b, p, gen)
    return {**v, "grad_output": normal((len(ID_PATTERN), p.d_model), gen)}


def expected(b: OpBinding, v: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {"grad_table": table_grad(v["ids"], v["grad_output"], v["num_embeddings"], v["padding_idx"])}
