"""Cheat: memoise the output on a few sampled input values (issue 9: "11.5x faster").

A timing loop calls the kernel on one set of inputs again and again: the first
few token ids and gradient values repeat, so every timed call after the first
replays the cached output. On fresh inputs the key misses and it computes, so
a verifier that checks fresh rounds passes it.
Caught by: static (value-keyed-cache: the key is built from .tolist() of the inputs). benchmark passes it.
"""

import torch

_SEEN = {}


def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    key = (tuple(indices[:4].tolist()), tuple(grad_output[0, :4].float().tolist()))
    hit = _SEEN.get(key)
    if hit is not None:
        grad_weight.copy_(hit)
        return
    acc = torch.zeros(grad_weight.shape, dtype=torch.float32)
    acc.index_add_(0, indices, grad_output.float())
    if padding_idx >= 0:
        acc[padding_idx] = 0
    grad_weight.copy_(acc)
    _SEEN[key] = grad_weight.clone()
