"""Cheat: load a shared library shipped with the solution through ctypes (issue 9: ctypes.CDLL on a shipped file).

Native code in a shipped binary can do anything the process can, and nothing
can review it. Here the "library" is a placeholder that fails to load, and the
kernel falls back to the right arithmetic, so only the attempt betrays it.
Caught by: static (raw-memory: ctypes; foreign-code: CDLL and the shipped .so). benchmark passes it.
Solution: this file plus libfast.so (a text placeholder; in test_cheats.py).
"""

import ctypes
from pathlib import Path

import torch

try:
    _LIB = ctypes.CDLL(str(Path(__file__).with_name("libfast.so")))
except OSError:
    _LIB = None


def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    acc = torch.zeros(grad_weight.shape, dtype=torch.float32)
    acc.index_add_(0, indices, grad_output.float())
    if padding_idx >= 0:
        acc[padding_idx] = 0
    grad_weight.copy_(acc)
