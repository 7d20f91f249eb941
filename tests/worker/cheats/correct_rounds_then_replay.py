"""Cheat: compute for as many calls per shape as the verifier's correctness rounds, then replay the banked output.

The code is public, so the round count is too (worker.stages.benchmark.stage.ROUNDS; SOL-ExecBench's driver checks
a fixed number of rounds the same way). Every checked round is right; every later call, the timed ones, returns the
last correct output for its shape in no time. The state lives on the entry function, not in a global or a
module-level cache, so the cache rules see nothing to name.
Caught by: benchmark (its timed calls run on fresh inputs of their own, and the checked ones among them are judged).
"""

import torch

ROUNDS = 10


def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    seen = run.__dict__.setdefault("seen", {})
    key = (tuple(grad_output.shape), tuple(grad_weight.shape))
    calls, banked = seen.get(key, (0, None))
    if calls >= ROUNDS and banked is not None:
        grad_weight.copy_(banked)
        seen[key] = (calls + 1, banked)
        return
    acc = torch.zeros(grad_weight.shape, dtype=torch.float32)
    acc.index_add_(0, indices, grad_output.float())
    if padding_idx >= 0:
        acc[padding_idx] = 0
    grad_weight.copy_(acc)
    seen[key] = (calls + 1, grad_weight.clone())
