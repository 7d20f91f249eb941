"""Cheat: launch the work on a side stream and return before it finishes.

CUDA events recorded on the default stream do not see work on another stream,
so the timer measures only the launch. On the CPU there is no stream and the
work runs inline, so the values are right and the benchmark passes it.
Caught by: static (side-stream: torch.cuda.Stream / torch.cuda.stream).
"""

import torch


def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    stream = torch.cuda.Stream() if grad_weight.is_cuda else None
    ctx = torch.cuda.stream(stream) if stream is not None else torch.no_grad()
    with ctx:
        acc = torch.zeros(grad_weight.shape, dtype=torch.float32, device=grad_weight.device)
        acc.index_add_(0, indices, grad_output.float())
        if padding_idx >= 0:
            acc[padding_idx] = 0
        grad_weight.copy_(acc)
