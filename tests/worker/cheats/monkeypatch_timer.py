"""Cheat: replace the timer and the checker's comparison in the process that runs the kernel.

time.perf_counter runs at a tenth of the real rate, torch.allclose always agrees.
The values this kernel writes are right; what it forges is the measurement.
The child reports the replaced functions in its timing reply ('tampered').
Caught by: static (timer-monkeypatch, checker-monkeypatch) and benchmark (tampered timers).
"""

import time

import torch

_real = time.perf_counter
time.perf_counter = lambda: _real() / 10.0
torch.allclose = lambda *args, **kwargs: True


def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    acc = torch.zeros(grad_weight.shape, dtype=torch.float32)
    acc.index_add_(0, indices, grad_output.float())
    if padding_idx >= 0:
        acc[padding_idx] = 0
    grad_weight.copy_(acc)
