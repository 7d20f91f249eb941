"""Cheat: return (non-DPS) a lazy tensor subclass that does its work only when the checker touches it.

The timed call returns at once; the sum is computed inside the checker's first
operation on the result. The harness reports whether results are exact
torch.Tensor, and the benchmark refuses subclasses.
Caught by: static (tensor-subclass) and benchmark (subclass result).
Solution spec: destination_passing_style false.
"""

import torch


class LazyGrad(torch.Tensor):
    @staticmethod
    def __new__(cls, indices, grad_output, num_embeddings, padding_idx):
        shell = torch.empty(num_embeddings, grad_output.shape[1], dtype=torch.bfloat16, device=grad_output.device)
        t = torch.Tensor._make_subclass(cls, shell)
        t._pending = (indices, grad_output, num_embeddings, padding_idx)
        return t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        for a in args:
            pending = getattr(a, "_pending", None) if isinstance(a, LazyGrad) else None
            if pending is not None:
                a._pending = None
                indices, grad_output, n, pad = pending
                with torch._C.DisableTorchFunctionSubclass():
                    acc = torch.zeros(n, grad_output.shape[1], dtype=torch.float32, device=grad_output.device)
                    acc.index_add_(0, indices, grad_output.float())
                    if pad >= 0:
                        acc[pad] = 0
                    a.copy_(acc)
        return super().__torch_function__(func, types, args, kwargs or {})


def run(indices, grad_output, num_embeddings, padding_idx):
    return LazyGrad(indices, grad_output, num_embeddings, padding_idx)
