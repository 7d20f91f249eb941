"""One timed window per device at a time, across every worker process of the host.

Audits share a GPU: intake, probes, oracles and canaries of several audits overlap, which is what makes a worker
fast. The benchmark's timed window is the exception: a kernel timed while another audit's canary trains on the same
card measures the neighbour as much as itself. So the stage takes an exclusive `flock` on a file named for the device
(/dev/shm/kaudit-gpu<N>.lock, N the physical index) for the timed window only (the kernel's and the reference's
interleaved blocks), and records how long it waited (`timing.lock_wait_s`) and that the window was exclusive.

flock locks belong to the open file, so a worker that dies releases its lock with its descriptors: no stale lock.
A blocking flock is restarted after a signal unless the handler raises, so the audit's soft time limit still
interrupts a wait.

Optionally (KAUDIT_LOCK_GPU_CLOCKS, root only) the GPU's graphics clock is locked for the window with
`nvidia-smi -lgc` and reset with `-rgc` after it; whether that worked is recorded (`timing.clocks_locked`). Only the
lock's holder touches the clocks, so two audits never fight over them.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch
from pydantic import BaseModel

from worker.numerics.timing_settings import TimingSettings

NVIDIA_SMI_TIMEOUT_S = 10.0


class WindowRecord(BaseModel):
    exclusive: bool
    lock_path: str | None
    lock_wait_s: float
    clocks_locked: bool = False
    clocks_note: str | None = None


def device_id(device: str) -> str:
    """The device as the host knows it: 'cpu', or the GPU's physical index (through CUDA_VISIBLE_DEVICES, so that
    two processes that see different cards as cuda:0 take different locks), or its UUID where that is how the
    visible devices are named."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return "cpu"
    index = dev.index if dev.index is not None else (torch.cuda.current_device() if torch.cuda.is_available() else 0)
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if index < len(visible):
        return re.sub(r"[^A-Za-z0-9_.-]", "_", visible[index])
    return str(index)


def lock_path(device: str, lock_dir: Path) -> Path:
    ident = device_id(device)
    return lock_dir / ("kaudit-cpu.lock" if ident == "cpu" else f"kaudit-gpu{ident}.lock")


@contextmanager
def exclusive(path: Path, on_wait: Callable[[], None] | None = None) -> Iterator[float]:
    """Hold an exclusive flock on `path` for the block; yields the seconds spent waiting for it. `on_wait` is
    called once, before blocking, when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        t0 = time.monotonic()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        waited = time.monotonic() - t0
        try:
            yield waited
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _smi(args: list[str]) -> tuple[bool, str]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return False, "nvidia-smi not found"
    try:
        done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return False, f"nvidia-smi {' '.join(args)}: {err}"
    out = (done.stdout + done.stderr).strip()
    return done.returncode == 0, out[-300:]


def _lock_clocks(ident: str, want: str) -> tuple[bool, str]:
    mhz = want
    if want == "max":
        ok, out = _smi(["-i", ident, "--query-gpu=clocks.max.sm", "--format=csv,noheader,nounits"])
        if not ok or not out.strip().isdigit():
            return False, f"could not read the maximum clock: {out}"
        mhz = out.strip()
    ok, out = _smi(["-i", ident, "-lgc", f"{mhz},{mhz}"])
    return ok, (f"graphics clock locked at {mhz} MHz" if ok else f"clock lock refused: {out}")


@contextmanager
def timed_window(
    device: str, settings: TimingSettings | None = None, on_wait: Callable[[], None] | None = None
) -> Iterator[WindowRecord]:
    """The device's exclusive timed window (see the module's docstring). With the lock turned off, or its folder
    not writable, the window still runs, recorded as not exclusive."""
    s = settings or TimingSettings.from_env()
    record = WindowRecord(exclusive=False, lock_path=None, lock_wait_s=0.0)
    ident = device_id(device)
    with ExitStack() as stack:
        if s.timing_lock:
            path = lock_path(device, s.timing_lock_dir)
            try:
                record.lock_wait_s = stack.enter_context(exclusive(path, on_wait))
                record.exclusive, record.lock_path = True, str(path)
            except OSError as err:  # no such folder, or not writable: time without the lock, and say so
                record.lock_path = f"{path} (not taken: {err.strerror or err})"
        if s.lock_gpu_clocks is not None and ident != "cpu":
            record.clocks_locked, record.clocks_note = _lock_clocks(ident, s.lock_gpu_clocks)
        elif ident != "cpu":
            record.clocks_note = "left alone (KAUDIT_LOCK_GPU_CLOCKS unset)"
        try:
            yield record
        finally:
            if record.clocks_locked:
                ok, out = _smi(["-i", ident, "-rgc"])
                if not ok:
                    record.clocks_note = f"{record.clocks_note}; reset failed: {out}"
