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

import fcntl
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from worker.numerics.device_slots import device_slot
from worker.numerics.timed_window import device_id
from worker.numerics.timing_settings import TimingSettings

# how often a stage that ran out of GPU memory runs again (worker.engine.run_stage), and how long it waits for
# memory before each new attempt: the neighbours' stages last seconds to a minute and release as they end
OOM_RETRIES = 2
WAIT_FOR_MEMORY_S = 60.0
FREE_SHARE = 0.25
# a need past this share of the card is not waited for: the neighbours never all leave at once
MAX_WAIT_SHARE = 0.9
RETRY_KIND = "oom-retry"
# how long a stage's first attempt holds off for a neighbour's retry (make_way): as long as a retry waits for memory,
# so that a retry that never finds its memory delays the others' stages by no more than that
HOLD_OFF_S = WAIT_FOR_MEMORY_S
HOLD_OFF_POLL_S = 0.1

_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_ASKED = re.compile(r"Tried to allocate (\d+(?:\.\d+)?) (B|KiB|MiB|GiB|TiB)")
_HELD = re.compile(r"this process has (\d+(?:\.\d+)?) (B|KiB|MiB|GiB|TiB) memory in use")


def release(device: str) -> None:
    """Returns the caching allocator's unused blocks on a GPU audit's device to the driver."""
    if torch.device(device).type == "cuda" and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def need_after_oom(message: str, with_held: bool = True) -> int | None:
    """The bytes a stage that ran out of memory needs at least: what its process held when it ran out (unless not
    `with_held`: work run again in the same process keeps what it holds) plus what it asked for then, as PyTorch's
    caching allocator words its OutOfMemoryError (also inside a sandbox child's error). None where the message does
    not say, as the driver's own `CUDA error: out of memory` does not."""
    asked, held = _ASKED.search(message), _HELD.search(message)
    if asked is None:
        return None
    need = float(asked.group(1)) * _UNITS[asked.group(2)]
    if held is not None and with_held:
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
    turns, the first retry finds its memory and the next waits for what that one leaves; while a retry holds its turn
    the neighbours' next stages hold off (make_way), so the memory they free stays free for it."""
    with device_slot(device, RETRY_KIND, 1, lock_dir), _holding_off(device, lock_dir):
        wait_for_free(device, need_bytes)
        yield


def _hold_off_path(device: str, lock_dir: Path | None) -> Path:
    directory = lock_dir if lock_dir is not None else TimingSettings.from_env().timing_lock_dir
    return directory / f"kaudit-oom-hold-off-gpu{device_id(device)}.lock"


@contextmanager
def _holding_off(device: str, lock_dir: Path | None) -> Iterator[None]:
    """While a retry waits for memory and runs, the neighbours' stages do not start (make_way): the memory their
    running stages give back as they end is left for the retry instead of being taken by their next stage.

    Why: on the H100 (2026-12-07, benchmarks/results/h100-2026-12-07) the retries took turns, but each turn waited
    for memory that the neighbours freed at the end of one stage and took again at the start of the next, and four
    memory-heavy audits ran out on every attempt until their budgets ended."""
    if not device.startswith("cuda"):
        yield
        return
    fd = os.open(_hold_off_path(device, lock_dir), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the first attempts only look at this lock (shared, for an instant)
        yield
    finally:
        os.close(fd)  # closing the descriptor drops the lock, as a process that dies does


def make_way(device: str, lock_dir: Path | None = None, timeout_s: float = HOLD_OFF_S) -> float:
    """Before a stage's first attempt on `device`: waits while another audit's stage that ran out of memory holds
    its retry's turn, for at most `timeout_s` (a retry that cannot find its memory does not stall the card's other
    audits for longer than it waits for it). The seconds waited; nothing to wait for on the CPU."""
    if not device.startswith("cuda"):
        return 0.0
    fd = os.open(_hold_off_path(device, lock_dir), os.O_RDWR | os.O_CREAT, 0o666)
    t0 = time.monotonic()
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() - t0 >= timeout_s:
                    break
                time.sleep(HOLD_OFF_POLL_S)
                continue
            fcntl.flock(fd, fcntl.LOCK_UN)
            break
    finally:
        os.close(fd)
    return time.monotonic() - t0
