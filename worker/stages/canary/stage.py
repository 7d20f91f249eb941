"""The canary stage's name and the rule its report states (worker.canary.judge applies the rule)."""

from __future__ import annotations

NAME = "canary"

RULE = (
    "fails if the kernel's output on the op's real arguments along the reference run exceeds the budget ratio "
    "(default 4x) of the ideal output's fp64 error in any bucket of rows (on the generic path, of the largest error "
    "of the reference at its own dtypes and with its reductions in other honest orders, where that is larger), or "
    "if, per optimiser, the mean over checkpoints of the paired held-out loss gap (submission - reference, same "
    "seed/init/batches) exceeds max(band_factor x largest |null gap|, loss_floor); nulls = reference reruns and "
    "reference with its op output moved 1 ulp on a random half of elements"
)
