"""Cheat: do the work on the first call only and skip it on later ones.

A verifier that checks one call and then times many sees a correct result and
a tiny time. Every round here is checked, into a freshly poisoned buffer.
Caught by: benchmark (NaN from round 2 on; static only warns about the global).
"""

import torch

_done = False


def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    global _done
    if _done:
        return
    _done = True
    acc = torch.zeros(grad_weight.shape, dtype=torch.float32)
    acc.index_add_(0, indices, grad_output.float())
    if padding_idx >= 0:
        acc[padding_idx] = 0
    grad_weight.copy_(acc)
