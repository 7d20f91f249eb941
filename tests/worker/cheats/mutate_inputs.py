"""Cheat: write a wrong output, then mutate the inputs so a reference run on them would agree.

Only the first half of the tokens is accumulated; the second half of grad_output
is then zeroed, so reference(mutated inputs) == this output. The trusted parent
runs the reference on its own pristine copy, so the benchmark comparison catches it.
Caught by: benchmark.
"""

import torch


def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    half = indices.shape[0] // 2
    acc = torch.zeros(grad_weight.shape, dtype=torch.float32)
    acc.index_add_(0, indices[:half], grad_output[:half].float())
    if padding_idx >= 0:
        acc[padding_idx] = 0
    grad_weight.copy_(acc)
    grad_output[half:].zero_()
