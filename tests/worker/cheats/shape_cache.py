"""Cheat: compute once per shape, then replay the cached output for every later call of that shape.

A verifier that reuses one set of inputs across its rounds cannot tell.
Fresh inputs in every round make the replayed output wrong.
Caught by: benchmark (static only warns: shape-keyed caches are also how workspaces are reused).
"""

import torch

_CACHE = {}


def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    key = (tuple(grad_output.shape), tuple(grad_weight.shape))
    if key in _CACHE:
        grad_weight.copy_(_CACHE[key])
        return
    acc = torch.zeros(grad_weight.shape, dtype=torch.float32)
    acc.index_add_(0, indices, grad_output.float())
    if padding_idx >= 0:
        acc[padding_idx] = 0
    grad_weight.copy_(acc)
    _CACHE[key] = grad_weight.clone()
