"""Trusted work on the audit's GPU where it has room, on the CPU where it does not.

fp64 is the same arithmetic on both, so where the work runs changes its cost, not its answer; running out of GPU
memory (a card shared by several audits) moves it to the host, never to a lower precision."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")
CPU = torch.device("cpu")
log = logging.getLogger(__name__)


def on_device_or_cpu(device: torch.device | str, fn: Callable[[torch.device], T]) -> T:
    """fn(device) for a GPU device; fn(CPU) for the CPU, or where the GPU ran out of memory."""
    dev = torch.device(device)
    if dev.type == "cuda":
        try:
            return fn(dev)
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            log.warning(
                "the GPU ran out of memory; %s runs on the CPU instead", getattr(fn, "__qualname__", "the work")
            )
    return fn(CPU)
