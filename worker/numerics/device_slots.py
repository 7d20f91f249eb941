"""At most K memory-heavy phases at once on one device, across every worker process of the host.

Audits share a GPU, and most of a stage's memory is short-lived, so they overlap freely. The canary's training is
the exception: the stacked model's logits alone are batch x sequence x vocabulary in fp32 per run (537 MB at the GPU
profile, several runs stacked, with their softmax and gradient), so one training holds 10-30 GiB for its seconds.
Eight at once on a 141 GiB card, beside eight sandbox children and the probes, is what ran the card out of memory
at eight concurrent audits. A counting semaphore of K `flock`ed slot files (one per slot, named for the device as
worker.numerics.timed_window names its lock) admits K trainings; the others wait for a slot instead of failing and
retrying.

A flock belongs to the open file, so a process that dies gives its slot back with its descriptors: no stale slot.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from worker.numerics.timed_window import device_id
from worker.numerics.timing_settings import TimingSettings

SLOTS_ENV = "KAUDIT_CANARY_SLOTS"
# a training holds 10-30 GiB for its seconds; eight audits at once with no cap peaked at 117 GiB of a 141 GiB H200
# (benchmarks/results/h200-2026-12-03/callC_ttv_n8.md), before more definitions matched a canary site. Four leave
# the other stages room on an H200 and on an 80 GiB H100; the operator raises it for a larger card
DEFAULT_GPU_SLOTS = 4


class SlotSettings(BaseModel):
    """KAUDIT_CANARY_SLOTS: how many canary trainings may run at once on one GPU of the host (0: no limit). The CPU
    is never limited: its canary runs on one thread and its memory is the host's."""

    canary_slots: int = Field(DEFAULT_GPU_SLOTS, ge=0)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SlotSettings:
        source = os.environ if env is None else env
        if SLOTS_ENV not in source:
            return cls()
        try:
            return cls(canary_slots=source[SLOTS_ENV])  # type: ignore[arg-type]
        except ValidationError:
            raise ValueError(f"{SLOTS_ENV}={source[SLOTS_ENV]!r}: a whole number, 0 for no limit") from None


def slot_paths(device: str, kind: str, slots: int, lock_dir: Path) -> list[Path]:
    ident = device_id(device)
    return [lock_dir / f"kaudit-{kind}-gpu{ident}-{i}.lock" for i in range(slots)]


POLL_S = 0.05


def _take_free(fds: list[int]) -> int | None:
    for fd in fds:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue
        return fd
    return None


@contextmanager
def device_slot(device: str, kind: str, slots: int, lock_dir: Path | None = None) -> Iterator[float]:
    """Hold one of `slots` slots of `kind` on `device` for the block; yields the seconds spent waiting. A free slot
    is taken at once. When all are held, the waiters queue on a gate (one more flock, which the kernel hands to one
    waiter at a time), and the gate's holder takes the first slot that frees, checking every POLL_S: a holder trains
    for seconds, so the poll costs nothing measurable. No limit on the CPU or with slots == 0."""
    if not device.startswith("cuda") or slots <= 0:
        yield 0.0
        return
    directory = lock_dir if lock_dir is not None else TimingSettings.from_env().timing_lock_dir
    paths = slot_paths(device, kind, slots, directory)
    fds = [os.open(p, os.O_RDWR | os.O_CREAT, 0o666) for p in paths]
    gate = os.open(directory / f"kaudit-{kind}-gpu{device_id(device)}-queue.lock", os.O_RDWR | os.O_CREAT, 0o666)
    t0 = time.monotonic()
    try:
        held = _take_free(fds)
        if held is None:
            fcntl.flock(gate, fcntl.LOCK_EX)
            try:
                while (held := _take_free(fds)) is None:
                    time.sleep(POLL_S)
            finally:
                fcntl.flock(gate, fcntl.LOCK_UN)
        waited = time.monotonic() - t0
        try:
            yield waited
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)
    finally:
        for fd in (*fds, gate):
            os.close(fd)
