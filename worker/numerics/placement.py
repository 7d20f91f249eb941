"""Trusted work on the audit's GPU where it has room, on the CPU where it does not.

fp64 is the same arithmetic on both, so where the work runs changes its cost, not its answer; running out of GPU
memory (a card shared by several audits) moves it to the host, never to a lower precision.

Large work waits for the card first. Seen on an H100 (2026-12-07, benchmarks/results/h100-2026-12-07/call2): eleven
trusted measurements moved to the host beside three neighbours, and the audits of the two definitions with half a
billion elements per output (attention_softmax, cross_entropy) spent their whole 300 s budget without a verdict;
fp64 over that many elements on the host is slow enough to be a likely part of why. The neighbours' stages free their memory as they end, usually
within seconds, so a measurement that needs gigabytes waits for them and runs again on the GPU before it goes to
the host; a small one goes to the host at once, where it costs less than the wait."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from worker.numerics import gpu_memory

T = TypeVar("T")
CPU = torch.device("cpu")
log = logging.getLogger(__name__)
# work that asked for at least this much when it ran out waits for the card instead of moving to the host at once
WAIT_FOR_CARD_FROM_BYTES = 1 << 30
WAIT_FOR_CARD_S = 30.0


def on_device_or_cpu(device: torch.device | str, fn: Callable[[torch.device], T], wait_s: float = WAIT_FOR_CARD_S) -> T:
    """fn(device) for a GPU device; fn(CPU) for the CPU, or where the GPU ran out of memory: at once for work that
    asked for less than WAIT_FOR_CARD_FROM_BYTES, else after one more try on the GPU once what it asked for is free
    (waiting at most `wait_s`)."""
    dev = torch.device(device)
    what = getattr(fn, "__qualname__", "the work")
    if dev.type == "cuda":
        for attempt in (1, 2):
            try:
                return fn(dev)
            except torch.OutOfMemoryError as err:
                torch.cuda.empty_cache()
                need = gpu_memory.need_after_oom(str(err), with_held=False)
                large = need is not None and need >= WAIT_FOR_CARD_FROM_BYTES
                if attempt == 1 and large and gpu_memory.wait_for_free(str(dev), need, timeout_s=wait_s):
                    log.warning("the GPU ran out of memory; %s runs there again, its memory free", what)
                    continue
                log.warning("the GPU ran out of memory; %s runs on the CPU instead", what)
                break
    return fn(CPU)


def copy_to(a: Any, device: torch.device | str) -> Any:
    """A tensor argument copied to `device` (a copy even where it is there already: the callee may write into it);
    anything else as it is."""
    return a.to(device, copy=True) if isinstance(a, torch.Tensor) else a
