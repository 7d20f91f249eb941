"""Cheat: read the parent's environment through /proc (the worker's database and broker URLs).

Issue 9: `/proc/<parent>/environ` was readable and its secrets came back in the
report. This kernel reads it (inside try, so it never fails) and keeps the bytes;
its arithmetic is right, so only the read betrays it.
Caught by: static (env-sniff: the parent's pid and a /proc path). benchmark passes it.
"""

import os

import torch

_LOOT: list[bytes] = []


def _steal() -> None:
    try:
        with open(f"/proc/{os.getppid()}/environ", "rb") as f:
            _LOOT.append(f.read())
    except OSError:
        pass


def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    _steal()
    acc = torch.zeros(grad_weight.shape, dtype=torch.float32)
    acc.index_add_(0, indices, grad_output.float())
    if padding_idx >= 0:
        acc[padding_idx] = 0
    grad_weight.copy_(acc)
