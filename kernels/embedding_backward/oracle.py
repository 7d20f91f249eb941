"""Trusted fp64 embedding backward, computed from the same (already rounded) inputs, on their device."""

import torch


def run(indices, grad_output, num_embeddings, padding_idx):
    grad = torch.zeros(num_embeddings, grad_output.shape[1], dtype=torch.float64, device=grad_output.device)
    grad.index_add_(0, indices.to(grad.device), grad_output.double())
    if padding_idx >= 0:
        grad[padding_idx] = 0
    return (grad,)
