"""Canary training with any ops in the model, for the site tests that compare the trusted op with a kernel's.

worker.canary.train.train always calls a kernel (KernelOps); these tests also train the trusted `Ops()` itself, so
they run the same steps (CPU, no autocast, the profile's gradient clip) on the ops they are given."""

from __future__ import annotations

import torch

from worker.canary.matching import SiteMatch
from worker.canary.model import build, init_state
from worker.canary.ops import Ops
from worker.canary.profiles import Optimizer
from worker.canary.train import make_optimizer


def train_with_ops(
    found: SiteMatch, ops: Ops, batches: torch.Tensor, opt: Optimizer
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """`opt` steps on `batches` ([steps, B, T+1]) from the site's initial weights: each step's loss and the final
    weights."""
    p, b = found.profile, found.binding
    assert b is not None
    model = build(p, b, init_state(p, b, 0), "cpu")
    optim = make_optimizer(p, opt, list(model.parameters()))
    losses: list[float] = []
    for seq in batches:
        loss = model.loss(seq, ops)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), p.grad_clip)
        optim.step()
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}
