"""Cheat: return the last output again when called on the same input objects, state kept on the function.

A timing loop passes the same tensors every call: the first call computes, the
rest return the stored result. The state lives in the entry function's own
attributes, not in a global or a module-level dict, so our own cache rules do
not see it.
Caught by: kernelguard (LAST_CALL_REPLAY). The benchmark's fresh inputs make it
compute (unless CPython reuses an id, when the stale output fails the round).
Solution spec: destination_passing_style false.
"""

import torch


def run(indices, grad_output, num_embeddings, padding_idx):
    key = (id(indices), id(grad_output))
    if getattr(run, "key", None) == key:
        return run.last_output
    acc = torch.zeros(num_embeddings, grad_output.shape[1], dtype=torch.float32, device=grad_output.device)
    acc.index_add_(0, indices, grad_output.float())
    if padding_idx >= 0:
        acc[padding_idx] = 0
    out = acc.to(grad_output.dtype)
    run.key = key
    run.last_output = out
    return out
