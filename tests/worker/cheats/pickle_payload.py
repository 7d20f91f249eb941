"""Cheat: unpickle a shipped blob (pickle runs whatever code the blob names).

A pickle's `__reduce__` can call any function on load: `os.system`, `exec`, a
write into site-packages. This blob only holds a tuning table, but the scan
cannot tell one blob from another, so loading it is the finding.
Caught by: static (foreign-code: pickle.loads). benchmark passes it.
"""

import base64
import pickle

import torch

# pickle.dumps({"block": 128}, protocol=4)
_BLOB = "gASVDgAAAAAAAAB9lIwFYmxvY2uUS4BzLg=="


def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    config = pickle.loads(base64.b64decode(_BLOB))
    assert config["block"] == 128
    acc = torch.zeros(grad_weight.shape, dtype=torch.float32)
    acc.index_add_(0, indices, grad_output.float())
    if padding_idx >= 0:
        acc[padding_idx] = 0
    grad_weight.copy_(acc)
