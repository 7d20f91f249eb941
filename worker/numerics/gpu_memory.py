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

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from worker.numerics.device_slots import device_slot

# how often a stage that ran out of GPU memory runs again (worker.engine.run_stage), and how long it waits for
# memory before each new attempt: the neighbours' stages last seconds to a minute and release as they end
OOM_RETRIES = 2
WAIT_FOR_MEMORY_S = 60.0
FREE_SHARE = 0.25
# a need past this share of the card is not waited for: the neighbours never all leave at once
MAX_WAIT_SHARE = 0.9
RETRY_KIND = "oom-retry"

_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_ASKED = re.compile(r"Tried to allocate (\d+(?:\.\d+)?) (B|KiB|MiB|GiB|TiB)")
_HELD = re.compile(r"this process has (\d+(?:\.\d+)?) (B|KiB|MiB|GiB|TiB) memory in use")


def release(device: str) -> None:
    """Returns the caching allocator's unused blocks on a GPU audit's device to the driver."""
    if torch.device(device).type == "cuda" and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def need_after_oom(message: str) -> int | None:
    """The bytes a stage that ran out of memory needs at least: what its process held when it ran out plus what it
    asked for then, as PyTorch's caching allocator words its OutOfMemoryError (also inside a sandbox child's error).
    None where the message does not say, as the driver's own `CUDA error: out of memory` does not."""
    asked, held = _ASKED.search(message), _HELD.search(message)
    if asked is None:
        return None
    need = float(asked.group(1)) * _UNITS[asked.group(2)]
    if held is not None:
        need += float(held.group(1)) * _UNITS[held.group(2)]
    return int(need)


def wait_for_free(
    device: str, need_bytes: int | None = None, share: float = FREE_SHARE, timeout_s: float = WAIT_FOR_MEMORY_S
) -> bool:
    """Waits until `need_bytes` of the GPU's memory are free (at most MAX_WAIT_SHARE of the card), or without a
    need until `share` of it is, as other audits' stages end and release theirs; or until `timeout_s` passes.
    Whether the memory came back. Nothing to wait for on the CPU."""
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return True
    deadline = time.monotonic() + timeout_s
    while True:
        free, total = torch.cuda.mem_get_info(torch.device(device))
        wanted = share * total if need_bytes is None else min(need_bytes, MAX_WAIT_SHARE * total)
        if free >= wanted:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)


@contextmanager
def retry_turn(device: str, need_bytes: int | None, lock_dir: Path | None = None) -> Iterator[None]:
    """The turn of one stage that ran out of memory to run again on `device`: one such retry at a time across every
    audit process of the host (a device slot, worker.numerics.device_slots), each starting once its need is free.

    Seen on an H100 (2026-12-06, benchmarks/results/h100-2026-12-06-fourth): four memory-heavy audits, started
    close together beside their neighbours, each ran out on all three attempts until its budget was spent; each
    retry had waited only for a quarter of the card, whatever it needed, and nothing kept two retries apart. In
    turns, the first retry finds its memory and the next waits for what that one leaves."""
    with device_slot(device, RETRY_KIND, 1, lock_dir):
        wait_for_free(device, need_bytes)
        yield
