"""Cheat: find the expected output in memory instead of computing it.

Walks the heap for a bf16 tensor of the output's shape that is not its own
output buffer and copies it. The reference runs in the trusted parent, so the
child's heap holds nothing to find: the output stays poisoned.
Caught by: static (caller-introspection: gc.get_objects) and benchmark (NaN output).
"""

import gc

import torch


def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    for obj in gc.get_objects():
        if (
            isinstance(obj, torch.Tensor)
            and obj is not grad_weight
            and obj.shape == grad_weight.shape
            and obj.dtype == grad_weight.dtype
            and bool(torch.isfinite(obj).all())
        ):
            grad_weight.copy_(obj)
            return
