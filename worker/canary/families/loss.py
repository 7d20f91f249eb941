"""Site "loss": the cross entropy of the model's next-token logits, one of the original sites, here matched from a
definition's signature and confirmed by its reference.

Signature: logits [tokens, vocab], targets [tokens] (integer), maybe ignore_index -> the loss (a scalar: the mean over
the tokens not ignored; or one per token) and/or grad_logits [tokens, vocab] (the gradient of that mean, or of the
per-token losses' sum). The roles are the original site's (worker.canary.binding.bind), so a matched definition trains
exactly as one whose audit.json names the site, through worker.canary.sites._Loss, which trains the mean: a scalar
loss that is a sum is another op. Where the definition takes ignore_index, some of the example's targets are it (the
value the site passes), so a mean must count only the other tokens and their rows get no gradient.

A log-softmax is the same site's other common kernel: logits [tokens, vocab] -> log-probabilities [tokens, vocab], no
targets (SiteOptions.log_probs). The trusted code takes the targets' mean negative log-likelihood from the kernel's
log-probabilities, and its gradient from them too (softmax = exp(log_probs), as a fused log-softmax backward does), so
the kernel's errors reach both the loss and every logit's gradient.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from worker.canary.binding import CanaryUnsupported, OpBinding, Site, SiteOptions
from worker.canary.binding import bind as bind_original
from worker.canary.families.common import const, inputs, make, normal, outputs, require, site_gives, token_count
from worker.canary.profiles import CanaryProfile
from worker.formats import Definition

SITE: Site = "loss"
# the inputs worker.canary.sites._Loss hands the kernel, and the ignore_index it passes
GIVEN = ("logits", "targets", "ignore_index")
IGNORE_INDEX = -100
ROWS = 8
IGNORED = (2, 5)  # the example's rows whose target is ignore_index, where the definition takes one


def _log_softmax_names(d: Definition) -> tuple[str, str]:
    """(logits, log_probs) names of a log-softmax's signature: one float [tokens, vocab] in, one of its axes out."""
    ins, outs = inputs(d), outputs(d)
    if (
        len(ins) != 1
        or ins[0].rank != 2
        or not ins[0].floating
        or len(outs) != 1
        or outs[0].axes != ins[0].axes
        or not outs[0].floating
    ):
        raise CanaryUnsupported("a log-softmax takes one float [tokens, vocab] tensor and returns one of its shape")
    return ins[0].name, outs[0].name


def _shapes(b: OpBinding, d: Definition) -> tuple[str, str]:
    """(tokens, vocab) axes, where logits are [tokens, vocab], targets [tokens], grad_logits like logits and the loss
    a scalar or one per token: the shapes worker.canary.sites._Loss hands the kernel."""
    logits = tuple(d.inputs[next(s.name for s in b.inputs if s.role == "logits")].shape or ())
    if b.options.log_probs:
        return logits[0], logits[1]
    targets = tuple(d.inputs[next(s.name for s in b.inputs if s.role == "targets")].shape or ())
    outs = {s.role: tuple(d.outputs[s.name].shape or ()) for s in b.outputs}
    if (
        len(logits) != 2
        or targets != logits[:1]
        or outs.get("grad_logits", logits) != logits
        or outs.get("loss", ()) not in ((), logits[:1])
    ):
        raise CanaryUnsupported(
            "a cross entropy takes logits [tokens, vocab] and targets [tokens] and returns the loss (a scalar or one "
            "per token) and/or grad_logits like the logits"
        )
    return logits[0], logits[1]


def bind(d: Definition, options: SiteOptions) -> OpBinding:
    if options.log_probs:
        logits, log_probs = _log_softmax_names(d)
        return make(SITE, d, {logits: "logits"}, {log_probs: "log_probs"}, options)
    # the original site's roles, so that the binding trains as one audit.json names
    b = bind_original(SITE, d)
    site_gives(b, GIVEN, "a cross entropy")
    _shapes(b, d)
    return b


def proposals(d: Definition) -> list[SiteOptions]:
    try:
        bind(d, SiteOptions())
    except CanaryUnsupported as cross_entropy:
        try:
            _log_softmax_names(d)
        except CanaryUnsupported as log_softmax:
            raise CanaryUnsupported(f"{cross_entropy}; {log_softmax}") from None
        require(d, ("log_softmax", "logsumexp", "log("), "log-softmax")  # not "log": every "logits" has it
        return [SiteOptions(log_probs=True)]
    return [SiteOptions()]


def dims(b: OpBinding, d: Definition, p: CanaryProfile) -> dict[str, int]:
    tokens, vocab = _shapes(b, d)
    if const(d, vocab) not in (None, p.vocab_size):
        raise CanaryUnsupported(
            f"the definition fixes {vocab} = {const(d, vocab)}; the canary's text has {p.vocab_size} token ids"
        )
    return token_count(p, const(d, tokens))


def example(b: OpBinding, p: CanaryProfile, gen: torch.Generator) -> dict[str, Any]:
    if b.options.log_probs:
        return {"logits": normal((ROWS, p.vocab_size), gen, 3.0)}
    targets = torch.randint(0, p.vocab_size, (ROWS,), generator=gen)
    if b.role_in("ignore_index") is not None:
        targets[list(IGNORED)] = IGNORE_INDEX
    # logits of std 3: a softmax far from uniform, so that the target's share of the gradient is not lost in the rest
    return {"logits": normal((ROWS, p.vocab_size), gen, 3.0), "targets": targets, "ignore_index": IGNORE_INDEX}


def expected(b: OpBinding, v: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The fp64 cross entropy of the tokens not ignored: their mean (0 where every token is ignored) and its gradient,
    or where the loss output is per token, the per-token losses and the gradient of their sum, as the site reads
    them; for a log-softmax, the fp64 log-probabilities."""
    if b.options.log_probs:
        return {"log_probs": torch.log_softmax(v["logits"].double(), dim=-1)}
    targets = v["targets"].long()
    loss_spec = b.role_out("loss")
    per_token = loss_spec is not None and loss_spec.rank == 1
    with torch.enable_grad():
        x = v["logits"].double().requires_grad_(True)
        each = F.cross_entropy(x, targets, ignore_index=v["ignore_index"], reduction="none")
        kept = (targets != v["ignore_index"]).sum().clamp(min=1)
        total = each.sum() if per_token else each.sum() / kept
        (grad,) = torch.autograd.grad(total, x)
    return {"loss": (each if per_token else total).detach(), "grad_logits": grad}
