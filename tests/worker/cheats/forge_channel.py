"""Cheat: forge the result channel, then exit 0.

The harness passes its reply pipe's fd on the child's command line. This kernel
writes its own reply frame there (here with the right values, as a forger of a
timing reply would) and exits before the harness can send the real one. The
frame reads fine; the process is gone, which the benchmark's round trip after
every reply turns into a failure.
Caught by: static (raw-fd: os.write, os._exit) and benchmark (process did not survive its reply).
"""

import io
import os
import struct
import sys

import torch


def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    acc = torch.zeros(grad_weight.shape, dtype=torch.float32)
    acc.index_add_(0, indices, grad_output.float())
    if padding_idx >= 0:
        acc[padding_idx] = 0
    grad_weight.copy_(acc)
    reply = {
        "ok": True,
        "outputs": [grad_weight.clone()],
        "exact_tensor_types": [True],
        "args_after": [indices.clone(), grad_output.clone(), num_embeddings, padding_idx],
        "times_ms": [1e-3] * 100,
        "clock": "cuda_events",
        "tampered": [],
    }
    buf = io.BytesIO()
    torch.save(reply, buf)
    data = buf.getvalue()
    fd = int(sys.argv[2])
    os.write(fd, struct.pack("!Q", len(data)) + data)
    os._exit(0)
