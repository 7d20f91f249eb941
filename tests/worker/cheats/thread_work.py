"""Cheat: do the work on another thread (on a GPU: launch there and return before it finishes).

The timer on the calling thread does not see the work. Here the thread is
joined so the values are right: the benchmark alone would pass it.
Caught by: static (thread-or-process).
"""

import threading

import torch


def _work(indices, grad_output, padding_idx, grad_weight):
    acc = torch.zeros(grad_weight.shape, dtype=torch.float32)
    acc.index_add_(0, indices, grad_output.float())
    if padding_idx >= 0:
        acc[padding_idx] = 0
    grad_weight.copy_(acc)


def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    t = threading.Thread(target=_work, args=(indices, grad_output, padding_idx, grad_weight))
    t.start()
    t.join()
