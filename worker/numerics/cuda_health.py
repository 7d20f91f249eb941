"""Whether this process can still use its GPU.

A device-side assert (an out-of-range index in `index_add_`, `gather`, `embedding`, ...) or an illegal memory
access leaves a process's CUDA context unusable: every later CUDA call raises the same error. Kernels under test
run in sandbox children, so theirs end with the child; an error in the auditor's own process would fail every
later audit it runs, so that process must be replaced instead of reused."""

from __future__ import annotations

import torch


def cuda_context_broken() -> bool:
    """True if this process initialised CUDA and its context no longer works; False if it never used CUDA."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return False
    try:
        torch.cuda.synchronize()
        return int(torch.ones(1, device="cuda").add_(1).item()) != 2
    except Exception:  # noqa: BLE001 - torch.AcceleratorError / RuntimeError: any failure means the context is gone
        return True
