"""A worker's spare sandbox children (worker.sandbox.pool): started ahead, each serves one audit only."""

from __future__ import annotations

import os
import signal
import threading

from worker.catalogue import load_catalogue
from worker.engine import run_audit
from worker.sandbox import Sandbox
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


def test_a_spare_is_warmed_before_it_is_handed_out_and_warm_up_is_refused_after_a_load() -> None:
    """The spare ran the canary model's warm-up (worker.canary.warm) in its own process before any submission;
    once a submission is loaded the op refuses, so warm-up code never runs next to a submission."""
    from worker.sandbox import SubmissionError

    pool = SandboxPool("cpu", "none", warm=True)
    try:
        pool.prestart()
        sb = pool.take()
        assert pool.handed_warm == 1 and pool.last_warm_s is not None and pool.last_warm_s > 0
        sb.load(EMB.example_solution("pytorch_fp32"))
        try:
            sb.request("warm", {"steps": 1})
        except SubmissionError as err:
            assert "only before a submission is loaded" in str(err)
        else:
            raise AssertionError("warm-up ran after a submission was loaded")
        sb.close()
    finally:
        pool.close()


class _FailsOnce(Sandbox):
    """A child whose first start raises an error that is not a SandboxError (as a bug in the start path would):
    measured on the H200, such an error killed the starter thread and every later `take` waited forever."""

    starts = 0

    def start(self) -> None:
        type(self).starts += 1
        if type(self).starts == 1:
            raise ValueError("an unexpected error while starting the spare")
        super().start()


def test_an_unexpected_error_starting_the_spare_does_not_hang_the_next_take() -> None:
    pool = SandboxPool("cpu", "none", factory=lambda: _FailsOnce("cpu", isolation="none"))
    done = threading.Event()
    got: list[object] = []

    def take() -> None:
        try:
            got.append(pool.take())
        finally:
            done.set()

    try:
        pool.prestart()
        threading.Thread(target=take, daemon=True).start()
        assert done.wait(120), "take() never returned: the starter thread died with the spare's error"
        sb = got[0]
        assert isinstance(sb, Sandbox) and sb.alive and pool.handed_warm == 0  # started anew for the audit
        sb.close()
    finally:
        pool.close()
