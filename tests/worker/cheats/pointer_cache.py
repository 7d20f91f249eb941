"""Cheat: replay a cached output keyed by the inputs' device pointers.

The caching allocator hands freed blocks back, so a fresh input often sits at
the address of the last one; a timing loop that reuses its inputs always hits.
Caught by: static (output-cache keyed on data_ptr()).
"""

import torch

_CACHE = {}


def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    key = (indices.data_ptr(), grad_output.data_ptr())
    hit = _CACHE.get(key)
    if hit is not None:
        grad_weight.copy_(hit)
        return
    acc = torch.zeros(grad_weight.shape, dtype=torch.float32)
    acc.index_add_(0, indices, grad_output.float())
    if padding_idx >= 0:
        acc[padding_idx] = 0
    grad_weight.copy_(acc)
    _CACHE[key] = grad_weight.clone()
