"""The per-device training slots (worker.numerics.device_slots): K holders at once across processes, the next waits."""

from __future__ import annotations

import multiprocessing
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from worker.numerics.device_slots import DEFAULT_GPU_SLOTS, SlotSettings, device_slot

SPAWN = multiprocessing.get_context("spawn")
WAIT_S = 60.0


def _hold(lock_dir: str, conn: Connection) -> None:
    with device_slot("cuda:0", "test", 2, Path(lock_dir)) as waited:
        conn.send(("held", waited))
        assert conn.recv() == "release"
    conn.send(("released", 0.0))


def test_two_slots_admit_two_processes_and_the_third_waits_for_one_to_end(tmp_path: Path) -> None:
    procs, conns = [], []
    try:
        for _ in range(3):
            mine, theirs = SPAWN.Pipe()
            procs.append(SPAWN.Process(target=_hold, args=(str(tmp_path), theirs)))
            conns.append(mine)
        procs[0].start()
        procs[1].start()
        for c in conns[:2]:
            assert c.poll(WAIT_S), "a holder of a free slot never said it held it"
            assert c.recv()[0] == "held"
        procs[2].start()
        # both slots are held: the third queues on the gate behind nobody, and polls the slots
        assert not conns[2].poll(0.5)
        conns[0].send("release")
        assert conns[2].poll(WAIT_S), "the third never got the slot the first gave back"
        kind, waited = conns[2].recv()
        assert kind == "held" and waited > 0
        conns[1].send("release")
        conns[2].send("release")
    finally:
        for p in procs:
            p.join(WAIT_S)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert sorted(f.name for f in tmp_path.iterdir()) == [
        "kaudit-test-gpu0-0.lock",
        "kaudit-test-gpu0-1.lock",
        "kaudit-test-gpu0-queue.lock",
    ]


def test_a_process_that_dies_gives_its_slot_back(tmp_path: Path) -> None:
    mine, theirs = SPAWN.Pipe()
    p = SPAWN.Process(target=_hold, args=(str(tmp_path), theirs))
    p.start()
    assert mine.poll(WAIT_S) and mine.recv()[0] == "held"
    p.kill()
    p.join(WAIT_S)
    with device_slot("cuda:0", "test", 1, tmp_path) as waited:  # slot 0 was the dead holder's, or free
        assert waited < WAIT_S


def test_the_cpu_and_a_limit_of_zero_never_wait(tmp_path: Path) -> None:
    with device_slot("cuda:0", "test", 1, tmp_path), device_slot("cuda:0", "test", 0, tmp_path) as waited:
        assert waited == 0.0  # slots == 0: no limit, even while the one slot is held
    with device_slot("cpu", "test", 1, tmp_path) as waited:
        assert waited == 0.0
    assert not any(f.name.endswith("cpu-0.lock") for f in tmp_path.iterdir())


def test_the_setting_is_read_from_the_environment_and_a_bad_value_is_named() -> None:
    assert SlotSettings.from_env({}).canary_slots == DEFAULT_GPU_SLOTS
    assert SlotSettings.from_env({"KAUDIT_CANARY_SLOTS": "0"}).canary_slots == 0
    with pytest.raises(ValueError, match="KAUDIT_CANARY_SLOTS='many'"):
        SlotSettings.from_env({"KAUDIT_CANARY_SLOTS": "many"})
