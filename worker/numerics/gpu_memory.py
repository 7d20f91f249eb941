"""The audit process's share of a GPU that several audits use at once.

PyTorch's caching allocator keeps every block it has freed for reuse and returns none to the driver on its own.
Measured on the H200 (2026-12-02, one audit at a time): an audit process reserved up to 46.3 GiB while it never
had more than 6.2 GiB allocated, and at four audits at once the card's memory was full. Two remedies, both
PyTorch's own:
- expandable segments (`PYTORCH_CUDA_ALLOC_CONF`), which grow one mapping instead of caching blocks of every
  size a probe's drawn shapes ask for. The allocator reads the setting when it starts, so `worker/__init__.py`
  sets it as the default before anything touches the GPU, and the sandbox child inherits it;
- the cache emptied after each stage, so that memory an audit no longer uses goes back to the others.
"""

from __future__ import annotations

import time

import torch

# how often a stage that ran out of GPU memory runs again (worker.engine.run_stage), and how long it waits for
# memory before each new attempt: the neighbours' stages last seconds to a minute and release as they end
OOM_RETRIES = 2
WAIT_FOR_MEMORY_S = 60.0
FREE_SHARE = 0.25


def release(device: str) -> None:
    """Returns the caching allocator's unused blocks on a GPU audit's device to the driver."""
    if torch.device(device).type == "cuda" and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def wait_for_free(device: str, share: float = FREE_SHARE, timeout_s: float = WAIT_FOR_MEMORY_S) -> bool:
    """Waits until `share` of the GPU's memory is free again (other audits' stages end and release theirs), or
    `timeout_s` passes; whether it came back. Nothing to wait for on the CPU."""
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return True
    deadline = time.monotonic() + timeout_s
    while True:
        free, total = torch.cuda.mem_get_info(torch.device(device))
        if free >= share * total:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
