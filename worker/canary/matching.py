"""Which canary site a definition's op fits, from its signature and its reference, or why it fits none.

audit.json's `canary.site` names a site outright (or "none": no canary for this op). Otherwise every site family of
worker.canary.families reads the signature (inputs' and outputs' names, ranks, shared axes, dtypes; the words of the
reference: a matrix product, silu, rsqrt, softmax, cos and sin) and proposes the layouts it could mean. Each proposal
is then confirmed by running the reference on a small example of the op, at the canary's sizes, against the site's
trusted op: the first whose outputs agree to within 16 units in the last place of their dtype is the match. So a
signature that merely looks like a GEMM but adds a ReLU, or a softmax that is really a log-softmax, fits no site, and
the layouts a signature cannot tell apart (NeoX or GPT-J RoPE, which half of a fused GLU input is the gate) are read
from what the reference computes. The four original sites (norm, embedding, embedding_norm, loss) are matched this
way too, with the original site's roles, so an uncurated RMSNorm, embedding backward or cross entropy trains as a
curated one does; a site audit.json names among the original four is bound by its roles alone, unconfirmed, as
before any site was matched.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from worker.canary.binding import ORIGINAL_SITES, CanaryUnsupported, OpBinding, Site, SiteOptions, bind
from worker.canary.families import FAMILIES, Family
from worker.canary.judge import unit_roundoff
from worker.canary.profiles import CanaryProfile
from worker.canary.sizing import n_params, sized
from worker.formats import Definition
from worker.numerics.dtypes import to_torch

ULPS = 16  # agreement asked of the reference on the example, in units of its output dtype's roundoff


@dataclass(frozen=True)
class SiteMatch:
    binding: OpBinding | None  # None: no canary for this op
    profile: CanaryProfile  # the profile at the definition's constant sizes
    how: str  # how the site was found, or why there is none (a phrase after "it": "fits no canary site (...)")


def site_for(d: Definition, named: str | None, run: Callable[..., Any], p: CanaryProfile) -> SiteMatch:
    """The site audit.json names (`named`), or the one the signature and reference fit. Raises CanaryUnsupported
    where a named site does not fit the definition (the stage reports that as an error, not a skip)."""
    if named == "none":
        return SiteMatch(None, p, "has no canary site by its audit.json (canary.site = none)")
    if named is not None and named in ORIGINAL_SITES:
        # a person placed the op there: bound by its roles alone, unconfirmed, as it was before "norm" had a family
        return SiteMatch(bind(named, d), p, f"audit.json names site '{named}'")  # type: ignore[arg-type]
    if named is not None and named not in FAMILIES:
        raise CanaryUnsupported(f"audit.json names site '{named}', which is no canary site")
    found = match(d, run, p, sites=(named,) if named is not None else tuple(FAMILIES))
    if named is not None and found.binding is None:
        raise CanaryUnsupported(f"{d.name} at site '{named}' named in audit.json: {found.how}")
    if named is not None:
        return SiteMatch(found.binding, found.profile, f"audit.json names site '{named}'; " + found.how)
    return found


def match(
    d: Definition, run: Callable[..., Any], p: CanaryProfile, sites: Sequence[Site] = tuple(FAMILIES)
) -> SiteMatch:
    misses: list[str] = []
    for site in sites:
        fam = FAMILIES[site]
        try:
            proposals = fam.proposals(d)
        except CanaryUnsupported as err:
            misses.append(f"{site}: {err}")
            continue
        found = _first_confirmed(fam, d, proposals, run, p)
        if isinstance(found, SiteMatch):
            return found
        misses.append(f"{site}: {found}")
    return SiteMatch(None, p, "fits no canary site (" + "; ".join(misses) + ")")


def _first_confirmed(
    fam: Family, d: Definition, proposals: list[SiteOptions], run: Callable[..., Any], p: CanaryProfile
) -> SiteMatch | str:
    """The first proposal the reference confirms, or why none was."""
    why: list[str] = []
    best, tried = math.inf, False
    for options in proposals:
        try:
            b = fam.bind(d, options)
            q = sized(p, fam.dims(b, d, p), b)
            err = disagreement(fam, b, run, q)
        except CanaryUnsupported as e:
            why.append(str(e))
            continue
        best, tried = min(best, err), True
        if err <= 1.0:
            sizes_note = (
                f"; at the definition's sizes the model keeps {q.n_layers} of the profile's {p.n_layers} layers "
                f"({n_params(q, b) / 1e6:.1f}M parameters, the profile's limit {q.max_params / 1e6:g}M)"
                if q.n_layers < p.n_layers
                else ""
            )
            if q.d_model > p.d_model:
                sizes_note += (
                    f"; {q.d_model} wide, {q.d_model / p.d_model:g}x the profile's {p.d_model}, AdamW trains at "
                    f"{q.adamw_lr:.3g} (the profile's {p.adamw_lr:g} scaled by the widths' ratio)"
                )
            return SiteMatch(
                b,
                q,
                f"matched site '{b.site}' from the signature ({describe(b)}); the reference agrees "
                f"with the site's op on an example ({err * ULPS:.2g} ulp){sizes_note}",
            )
    if tried:
        off = (
            f"closest layout off by {best * ULPS:.3g} ulp"
            if math.isfinite(best)
            else "outputs of other shapes or not finite"
        )
        return f"the reference does not compute the site's op ({off})"
    return why[0] if why else "no layout fits"


def describe(b: OpBinding) -> str:
    roles = ", ".join(f"{s.name} as {s.role}" for s in (*b.inputs, *b.outputs))
    options = b.options.model_dump(exclude_defaults=True)
    return roles + ("; " + ", ".join(f"{k}={v}" for k, v in options.items()) if options else "")


def disagreement(fam: Family, b: OpBinding, run: Callable[..., Any], p: CanaryProfile) -> float:
    """How far the reference is from the site's trusted op on a small example, in units of ULPS of each output's
    dtype (the worst output); inf where it fails or returns other shapes."""
    values = fam.example(b, p, torch.Generator().manual_seed(0))
    args = b.args(values)
    # the trusted op starts from the values the reference receives: rounded to the definition's dtypes
    seen = dict(values)
    for spec, a in zip(b.inputs, args):
        seen[spec.role] = a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
    want = fam.expected(b, seen)
    try:
        out = run(*args)
    except Exception as err:
        raise CanaryUnsupported(f"the reference failed on the site's example: {type(err).__name__}: {err}") from err
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if len(outs) != len(b.outputs):
        return math.inf
    worst = 0.0
    for spec, o in zip(b.outputs, outs):
        e = want[spec.role].double()
        if not isinstance(o, torch.Tensor) or o.numel() != e.numel():
            return math.inf
        diff = float((o.detach().double().reshape(e.shape) - e).norm())
        scale = float(e.norm()) or 1.0
        tol = ULPS * max(unit_roundoff(to_torch(spec.dtype)), 1e-6)
        worst = max(worst, diff / scale / tol if math.isfinite(diff) else math.inf)
    return worst
