"""Warm a sandbox child up before any submission is loaded in it: a few training steps of the canary's model.

A fresh process pays for first use: the device's kernels loaded on first launch, cuBLAS and attention set up, the
optimisers' code paths. Measured on the H200 (2026-12-01, `benchmarks/results/h200-2026-12-02/profile_before*`), a
fresh child's first canary run took 12.3 s and its second, the same length, 4.2 s. A spare child
(worker.sandbox.pool) does this while it waits, off every audit's clock. Only trusted code runs here (plain ops,
random weights and tokens); nothing of it survives into the audit but the warmed process.
"""

from __future__ import annotations

import time

import torch

from worker.canary.model import Ops, build, init_state
from worker.canary.profiles import profile_for
from worker.canary.train import make_optimizer

SITE = "embedding"


def warm_up(device: torch.device, steps: int = 2) -> float:
    """`steps` training steps with each optimiser at the device's canary profile; returns the seconds it took."""
    t0 = time.perf_counter()
    p = profile_for("gpu" if device.type == "cuda" else "cpu")
    ops = Ops()
    seq = torch.randint(0, p.vocab_size, (p.batch_size, p.seq_len + 1), device=device)
    for opt in p.optimizers:
        model = build(p, SITE, init_state(p, SITE, 0), device)
        optim = make_optimizer(p, opt, list(model.parameters()))
        for _ in range(steps):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=p.autocast_bf16 and device.type == "cuda"):
                loss = model.loss(seq, ops)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), p.grad_clip)
            optim.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0
