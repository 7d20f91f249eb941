"""Cheat: talk to the service's own broker (issue 9: "It reaches the broker and the database").

`import redis` was not banned and the network was open: a kernel could enqueue
jobs, read other submissions' results or rewrite its own. This one would write
a key when called; the test runs only intake and static, so it never is.
Caught by: static (network: imports redis).
"""

import redis
import torch


def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    redis.Redis(host="127.0.0.1", port=6379).set("kaudit-forged-verdict", "pass")
    acc = torch.zeros(grad_weight.shape, dtype=torch.float32)
    acc.index_add_(0, indices, grad_output.float())
    grad_weight.copy_(acc)
