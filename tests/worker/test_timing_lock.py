"""The per-device timed-window lock (worker.numerics.timed_window): across processes, and only around the timed
window of the benchmark stage."""

from __future__ import annotations

import multiprocessing
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from worker.catalogue import load_catalogue
from worker.engine import run_audit
from worker.numerics.timed_window import exclusive, lock_path, timed_window
from worker.numerics.timing_settings import TimingSettings
from worker.stages.result import StageStatus

SPAWN = multiprocessing.get_context("spawn")
WAIT_S = 60.0


def _hold(path: str, conn: Connection) -> None:
    """Take the lock, say so with the time, hold it until told, then release it and say when."""
    with exclusive(Path(path)) as waited:
        conn.send(("held", time.monotonic(), waited))
        assert conn.recv() == "release"
        released = time.monotonic()
    conn.send(("released", released, 0.0))


def _blocked_on(path: Path, pid: int) -> bool:
    """/proc/locks lists a process blocked on a flock with '->' before the lock's inode."""
    inode = path.stat().st_ino
    for line in Path("/proc/locks").read_text().splitlines():
        parts = line.split()
        if "->" in parts and "FLOCK" in parts and str(pid) in parts and parts[-3].endswith(f":{inode}"):
            return True
    return False


def _wait_until(cond: Any, what: str) -> None:
    end = time.monotonic() + WAIT_S
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(what)
        time.sleep(0.02)


def test_a_second_process_waits_until_the_first_releases(tmp_path: Path) -> None:
    path = tmp_path / "kaudit-gpu0.lock"
    a_here, a_there = SPAWN.Pipe()
    b_here, b_there = SPAWN.Pipe()
    a = SPAWN.Process(target=_hold, args=(str(path), a_there))
    a.start()
    try:
        assert a_here.poll(WAIT_S) and a_here.recv()[0] == "held"
        b = SPAWN.Process(target=_hold, args=(str(path), b_there))
        b.start()
        try:
            # the kernel says b is blocked on the lock's inode, and b has not said it holds it
            _wait_until(lambda: _blocked_on(path, b.pid or -1), "the second process never blocked on the lock")
            assert not b_here.poll(0)
            a_here.send("release")
            _, released_at, _ = a_here.recv()
            assert b_here.poll(WAIT_S)
            state, acquired_at, waited = b_here.recv()
            assert state == "held" and acquired_at >= released_at and waited > 0
            b_here.send("release")
            assert b_here.recv()[0] == "released"
        finally:
            b.join(WAIT_S)
    finally:
        a.join(WAIT_S)
    assert a.exitcode == 0 and b.exitcode == 0


def test_the_lock_is_named_for_the_physical_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers that each see their own card as cuda:0 must not share a lock; two that see one card must."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert lock_path("cuda:1", tmp_path) == tmp_path / "kaudit-gpu5.lock"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f2c/1")
    assert lock_path("cuda:0", tmp_path) == tmp_path / "kaudit-gpuGPU-8f2c_1.lock"
    assert lock_path("cpu", tmp_path) == tmp_path / "kaudit-cpu.lock"


def test_an_unwritable_lock_folder_times_without_the_lock_and_says_so(tmp_path: Path) -> None:
    settings = TimingSettings(timing_lock_dir=tmp_path / "missing")
    with timed_window("cpu", settings) as record:
        pass
    assert record.exclusive is False and "not taken" in (record.lock_path or "")
    with timed_window("cpu", TimingSettings(timing_lock=False)) as off:
        pass
    assert off.exclusive is False and off.lock_path is None


def test_the_stage_takes_the_lock_only_around_its_timed_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another audit holds the device's timed window: this audit's intake and benchmark rounds run meanwhile, its
    timing waits for the lock, and the report says how long it waited."""
    monkeypatch.setenv("KAUDIT_TIMING_LOCK_DIR", str(tmp_path))
    emb = load_catalogue().get("embedding_backward")
    messages: list[str] = []
    waiting = threading.Event()
    waiting_since: list[float] = []

    def progress(msg: str) -> None:
        messages.append(msg)
        if "waiting for the timing lock" in msg:
            waiting_since.append(time.monotonic())
            waiting.set()

    result: dict[str, Any] = {}
    with exclusive(lock_path("cpu", tmp_path)):
        t = threading.Thread(
            target=lambda: result.update(
                report=run_audit(
                    emb,
                    emb.example_solution("pytorch_fp32"),
                    stages=["intake", "benchmark"],
                    seed=11,
                    progress=progress,
                )
            )
        )
        t.start()
        assert waiting.wait(300), messages[-5:]
        rounds = [m for m in messages if m.startswith("benchmark: workload")]
        # every verification round ran while the other audit held the window
        assert len(rounds) == 10 * len(emb.workloads("cpu")) and "round 10/10" in rounds[-1]
        assert "report" not in result
        held_until = time.monotonic()
    t.join(300)
    bench = {s.name: s for s in result["report"].stages}["benchmark"]
    assert bench.status is StageStatus.passed, bench.summary
    timing = bench.metrics["timing"]
    assert timing["exclusive"] is True and timing["lock_path"] == str(tmp_path / "kaudit-cpu.lock")
    assert timing["lock_wait_s"] >= held_until - waiting_since[0] and timing["clocks_locked"] is False
