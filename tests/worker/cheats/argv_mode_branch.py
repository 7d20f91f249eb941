"""Cheat: branch on the evaluator's mode as read from the command line (kernelguard's EVALUATOR_MODE_BRANCH).

GPU MODE's evaluator is started as `eval.py test|benchmark|leaderboard`; a
kernel that reads sys.argv can be exact in "test" and take a shortcut in
"benchmark". Here the shortcut is bf16 accumulation.
Caught by: static (env-sniff: sys.argv; and kernelguard's EVALUATOR_MODE_BRANCH). benchmark passes it.
"""

import sys

import torch


def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    fast = "benchmark" in sys.argv or "leaderboard" in sys.argv
    dtype = torch.bfloat16 if fast else torch.float32
    acc = torch.zeros(grad_weight.shape, dtype=dtype)
    acc.index_add_(0, indices, grad_output.to(dtype))
    if padding_idx >= 0:
        acc[padding_idx] = 0
    grad_weight.copy_(acc)
