"""Regression suite: one fixture per known way a submission cheats a verifier (tests/cheats/).

Each case says which of intake / static / benchmark catch it and asserts the
audit's verdict. The two that keep to the benchmark's tolerance (rounding to
what atol allows, and the measured bf16 accumulator) pass these three stages on
purpose: they are the probes stage's to catch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from worker.catalogue import load_catalogue
from worker.engine import run_audit
from worker.formats import solution_from_python_file
from worker.stages.result import AuditReport, StageStatus, Verdict

EMB = load_catalogue().get("embedding_backward")
CHEATS = Path(__file__).parent / "cheats"
STAGES = ["intake", "static", "benchmark"]
P, F = StageStatus.passed, StageStatus.failed


@dataclass(frozen=True)
class Case:
    fixture: str
    static: StageStatus
    benchmark: StageStatus | None  # None: either (depends on the allocator)
    caught_by: tuple[str, ...]  # the stages that fail it, in order; () = none of these three
    why: str  # substring of the first catching stage's summary
    dps: bool = True


CASES = [
    # mutating inputs so the reference agrees: the reference ran on a pristine copy
    Case("mutate_inputs", P, F, ("benchmark",), "of elements within"),
    # uninitialised output: NaN poison
    Case("uninitialised", P, F, ("benchmark",), "NaN/Inf"),
    # cached output keyed by shape: fresh inputs per round
    Case("shape_cache", P, F, ("benchmark",), "round 2/10"),
    # cached output keyed by pointer: static (benchmark too when the allocator reuses an address)
    Case("pointer_cache", F, None, ("static",), "[output-cache]"),
    # first call only: a poisoned buffer every round
    Case("first_call_only", P, F, ("benchmark",), "round 2/10"),
    # work on a thread (joined, so values are right): static
    Case("thread_work", F, P, ("static",), "[thread-or-process]"),
    # lazy tensor subclass (non-DPS): static and the benchmark's exact-type check
    Case("lazy_subclass", F, F, ("static", "benchmark"), "[tensor-subclass]", dps=False),
    # monkeypatched time.perf_counter and torch.allclose: static, and the child's tamper report
    Case("monkeypatch_timer", F, F, ("static", "benchmark"), "[timer-monkeypatch]"),
    # forged result frame then os._exit(0): static, and the liveness round trip after each reply
    Case("forge_channel", F, F, ("static", "benchmark"), "[raw-fd]"),
    # reading expected outputs from memory: nothing to find in the child
    Case("gc_snoop", F, F, ("static", "benchmark"), "[caller-introspection]"),
    # keeping only the precision the tolerance allows: passes here; probes must catch it
    Case("round_to_tolerance", P, P, (), ""),
    # the measured bug, bf16 accumulation: passes the benchmark on uniform ids; probes must catch it
    Case("bf16_accumulate", P, P, (), ""),
]


def _audit(case: Case, stages: list[str] = STAGES) -> AuditReport:
    sol = solution_from_python_file(CHEATS / f"{case.fixture}.py", EMB.name, destination_passing_style=case.dps)
    return run_audit(EMB, sol, stages=stages, seed=20240601)


@pytest.mark.parametrize("case", CASES, ids=[c.fixture for c in CASES])
def test_cheat_is_caught_by_the_expected_stage(case: Case) -> None:
    report = _audit(case)
    st = {s.name: s for s in report.stages}
    assert st["intake"].status is P, st["intake"].summary
    assert st["static"].status is case.static, st["static"].summary
    if case.benchmark is not None:
        assert st["benchmark"].status is case.benchmark, st["benchmark"].summary
    verdict = st["verdict"]
    caught = tuple(verdict.metrics["caught_by"])
    assert caught == case.caught_by if case.benchmark is not None else caught[: len(case.caught_by)] == case.caught_by
    if case.caught_by:
        assert report.verdict is Verdict.fail
        assert verdict.summary.startswith(f"fail: caught by {case.caught_by[0]}")
        assert case.why in st[case.caught_by[0]].summary
    else:
        # passes intake, static and benchmark: the later stages (probes) are the ones expected to catch it
        assert report.verdict is Verdict.pass_
        assert st["benchmark"].metrics["passes_benchmark"] is True


def test_cheat_fixtures_all_have_a_case() -> None:
    assert {p.stem for p in CHEATS.glob("*.py")} == {c.fixture for c in CASES}


def test_evidence_of_specific_cheats() -> None:
    """What each catching stage reports is specific enough for the author to see the cheat."""
    by = {c.fixture: c for c in CASES}
    mutate = {s.name: s for s in _audit(by["mutate_inputs"]).stages}["benchmark"]
    assert mutate.metrics["inputs_mutated"] == ["grad_output"]

    patched = {s.name: s for s in _audit(by["monkeypatch_timer"]).stages}
    assert patched["benchmark"].metrics["timing"]["tampered"] == ["time.perf_counter", "torch.allclose"]
    rules = {f["rule"] for f in patched["static"].evidence["findings"]}
    assert {"timer-monkeypatch", "checker-monkeypatch"} <= rules

    forged = {s.name: s for s in _audit(by["forge_channel"]).stages}["benchmark"]
    # the forged frame lacks the request's nonce (runner) or the child is gone afterwards (liveness check)
    assert ("out of sequence" in forged.summary) or ("did not survive its own reply to 'call'" in forged.summary)
    assert "round 1/10" in forged.summary


@pytest.mark.slow
def test_round_to_tolerance_is_caught_once_probes_exist() -> None:
    """Expected catcher of the precision cheat: the probes stage (realistic gradient scales)."""
    pytest.importorskip("worker.stages.probes")
    report = _audit(CASES[-2], stages=["intake", "static", "benchmark", "probes"])
    st = {s.name: s for s in report.stages}
    assert st["benchmark"].status is P
    assert st["probes"].status is F, st["probes"].summary
    assert report.verdict is Verdict.fail
