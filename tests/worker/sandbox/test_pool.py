"""A worker's spare sandbox children (worker.sandbox.pool): started ahead, each serves one audit only."""

from __future__ import annotations

import os
import signal

from worker.catalogue import load_catalogue
from worker.engine import run_audit
from worker.sandbox.pool import SandboxPool

EMB = load_catalogue().get("embedding_backward")


def _pid(sb) -> int:  # type: ignore[no-untyped-def]
    return int(sb.request("hello", {"device": "cpu"})["pid"])


def test_take_hands_over_the_spare_and_starts_the_next_one() -> None:
    pool = SandboxPool("cpu", "none")
    try:
        pool.prestart()
        first = pool.take()
        assert pool.handed_warm == 1
        second = pool.take()
        assert pool.handed_warm == 2 and first.alive and second.alive
        assert _pid(first) != _pid(second)  # never the same child twice
        first.close()
        second.close()
    finally:
        pool.close()


def test_a_spare_that_died_while_waiting_is_replaced_not_handed_out() -> None:
    pool = SandboxPool("cpu", "none")
    try:
        pool.prestart()
        pool.wait_ready()
        spare = pool._spare
        assert spare is not None and spare._proc is not None
        os.kill(spare._proc.pid, signal.SIGKILL)
        spare._proc.wait()
        sb = pool.take()
        assert sb is not spare and sb.alive and pool.handed_warm == 0
        sb.close()
    finally:
        pool.close()


def test_audits_through_a_pool_each_get_a_fresh_child_that_dies_with_the_audit() -> None:
    pool = SandboxPool("cpu", "none")
    sol = EMB.example_solution("pytorch_fp32")
    try:
        pool.prestart()
        reports = [run_audit(EMB, sol, stages=["intake"], seed=i, isolation="none", pool=pool) for i in range(2)]
        assert all(r.verdict.value == "pass" for r in reports), [r.summary for r in reports]
        assert pool.handed_warm == 2
        pool.wait_ready()
        assert pool._spare is not None and pool._spare.alive  # the next audit's child, already waiting
    finally:
        pool.close()
    assert pool._spare is None
