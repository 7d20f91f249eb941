"""Not a deliberate cheat: the measured bug. Accumulates the embedding gradient in bf16.

One contribution per row at a time (on the CPU, index_add_ into a bf16 tensor
does not round after each contribution unless the indices of one call are
unique), so every add rounds to bf16, as a bf16-atomic GPU kernel does. On
uniform token ids each row gets about one contribution and the benchmark passes
it; on real text a hot row gets thousands and the result drifts.
Caught by: probes (Zipfian / real-text ids). static and benchmark pass it.
"""

import torch


def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    grad_weight.zero_()
    order = torch.argsort(indices, stable=True)
    counts = torch.bincount(indices, minlength=num_embeddings)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.empty_like(indices)
    rank[order] = torch.arange(indices.shape[0], device=indices.device) - starts[indices[order]]
    for k in range(int(rank.max()) + 1 if indices.numel() else 0):
        sel = rank == k
        grad_weight.index_add_(0, indices[sel], grad_output[sel])
    if padding_idx >= 0:
        grad_weight[padding_idx] = 0
