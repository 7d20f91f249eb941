"""A stage that ran out of GPU memory runs again in its turn (one retry at a time on a device, across processes) and
once the memory its failed attempt needed is free (worker.numerics.gpu_memory.retry_turn); while it holds its turn,
the neighbours' stages hold off starting (make_way)."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import threading
import time
from pathlib import Path
from typing import Any

from worker.numerics import gpu_memory

GiB = 1 << 30
MiB = 1 << 20

# as the H100 worded them (benchmarks/results/h100-2026-12-06-fourth/call2/catalogue.json), the first inside the
# sandbox child's error that the engine sees
CHILD_OOM = (
    "the device ran out of memory in the submission's process (OutOfMemoryError: CUDA out of memory. Tried to "
    "allocate 2.00 GiB. GPU 0 has a total capacity of 79.18 GiB of which 1.28 GiB is free. Including non-PyTorch "
    "memory, this process has 8.66 GiB memory in use. Of the allocated memory 8.00 GiB is allocated by PyTorch, and "
    "69.50 MiB is reserved by PyTorch b)"
)
PARENT_OOM = (
    "CUDA out of memory. Tried to allocate 3.91 GiB. GPU 0 has a total capacity of 79.18 GiB of which 2.91 GiB is "
    "free. Process 749 has 6.46 GiB memory in use. Process 748 has 14.13 GiB memory in use. Including non-PyTorch "
    "memory, this process has 28.04 GiB memory in use. Process 833 has 15.33 GiB memory in use."
)


def test_the_need_is_what_the_process_held_plus_what_it_asked_for() -> None:
    assert gpu_memory.need_after_oom(CHILD_OOM) == int(10.66 * GiB)
    # the neighbours' processes ("Process 749 has ...") are not this one's need
    assert gpu_memory.need_after_oom(PARENT_OOM) == int((3.91 + 28.04) * GiB)
    assert gpu_memory.need_after_oom("CUDA out of memory. Tried to allocate 512.00 MiB") == 512 * MiB


def test_an_error_that_does_not_say_how_much_has_no_need() -> None:
    assert gpu_memory.need_after_oom("torch.AcceleratorError: CUDA error: out of memory") is None


def _queue_held(path: Path) -> bool:
    """Whether some holder has the gate that a waiting slot-taker queues on (worker.numerics.device_slots)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def test_a_second_retry_on_the_device_waits_for_the_first_to_end(tmp_path: Path) -> None:
    entered = threading.Event()

    def second() -> None:
        with gpu_memory.retry_turn("cuda:0", None, lock_dir=tmp_path):
            entered.set()

    queue = tmp_path / f"kaudit-{gpu_memory.RETRY_KIND}-gpu0-queue.lock"
    with gpu_memory.retry_turn("cuda:0", None, lock_dir=tmp_path):
        waiter = threading.Thread(target=second, daemon=True)
        waiter.start()
        deadline = time.monotonic() + 60
        while not _queue_held(queue):  # the second retry has queued behind the first
            assert time.monotonic() < deadline, "the second retry never queued"
            assert not entered.is_set(), "the second retry ran while the first held the turn"
            time.sleep(0.01)
        assert not entered.is_set()
    assert entered.wait(60), "the second retry never got the turn the first gave back"
    waiter.join(60)


def test_a_stage_does_not_start_while_a_neighbours_retry_holds_its_turn(tmp_path: Path) -> None:
    with gpu_memory.retry_turn("cuda:0", None, lock_dir=tmp_path):
        # held off for as long as it may be (the lower bound is the code's, not the machine's speed)
        assert gpu_memory.make_way("cuda:0", lock_dir=tmp_path, timeout_s=0.3) >= 0.3
        # another device's stages are not held off
        assert gpu_memory.make_way("cuda:1", lock_dir=tmp_path, timeout_s=30) < 30
    assert gpu_memory.make_way("cuda:0", lock_dir=tmp_path, timeout_s=30) < 30


def test_the_cpu_is_never_held_off(tmp_path: Path) -> None:
    with gpu_memory.retry_turn("cpu", None, lock_dir=tmp_path):
        assert gpu_memory.make_way("cpu", lock_dir=tmp_path, timeout_s=30) == 0.0


def _hold_a_retry(lock_dir: str, ready: Any) -> None:
    with gpu_memory.retry_turn("cuda:0", None, lock_dir=Path(lock_dir)):
        ready.send(True)
        time.sleep(3600)


def test_a_retry_held_by_another_process_holds_off_until_that_process_dies(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    parent_end, child_end = ctx.Pipe()
    holder = ctx.Process(target=_hold_a_retry, args=(str(tmp_path), child_end), daemon=True)
    holder.start()
    try:
        assert parent_end.poll(120) and parent_end.recv(), "the holder never took its retry's turn"
        assert gpu_memory.make_way("cuda:0", lock_dir=tmp_path, timeout_s=0.3) >= 0.3
    finally:
        holder.kill()
        holder.join(60)
    # a killed holder's lock goes with its descriptors: nothing stale holds the card's stages off
    assert gpu_memory.make_way("cuda:0", lock_dir=tmp_path, timeout_s=30) < 30
