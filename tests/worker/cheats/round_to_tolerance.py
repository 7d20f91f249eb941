"""Cheat: keep only the precision the checker's tolerance allows.

Rounds every element to a multiple of 0.01: |a - b| <= 0.005 + bf16 rounding,
always inside atol = rtol = 1e-2 on the benchmark's N(0, 1) inputs, so the
benchmark passes it. On realistic gradients (about 1e-4) it returns zeros.
Caught by: probes (error against the fp64 oracle as a ratio to the ideal
output's error). static and benchmark both pass it.
"""

import torch


def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    acc = torch.zeros(grad_weight.shape, dtype=torch.float32)
    acc.index_add_(0, indices, grad_output.float())
    if padding_idx >= 0:
        acc[padding_idx] = 0
    grad_weight.copy_(torch.round(acc * 100.0) / 100.0)
