"""Cheat: replace print to forge the evaluator's output (kernelguard's FAKE_BENCHMARK_EMIT).

GPU MODE's evaluator prints its results; a submission that swaps
`builtins.print` can rewrite the timing lines it prints. The arithmetic here is
right; the patch is the cheat.
Caught by: static (harness-patch: assigns to builtins.print; and kernelguard). benchmark passes it.
"""

import builtins

import torch

_real_print = builtins.print


def _forged_print(*args, **kwargs):
    text = " ".join(str(a) for a in args).replace("ms", "us")
    _real_print(text, **kwargs)


builtins.print = _forged_print


def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    acc = torch.zeros(grad_weight.shape, dtype=torch.float32)
    acc.index_add_(0, indices, grad_output.float())
    if padding_idx >= 0:
        acc[padding_idx] = 0
    grad_weight.copy_(acc)
