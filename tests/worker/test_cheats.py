"""Regression suite: one fixture per known way a submission cheats a verifier (tests/worker/cheats/).

Each case says which of intake / static / benchmark catch it, which static rules
(ours or kernelguard's) name it, and asserts the audit's verdict. The two that
keep to the benchmark's tolerance (rounding to what atol allows, and the
measured bf16 accumulator) pass these three stages on purpose: they are the
probes stage's to catch. Cases whose defence is the static stage run intake and
static only (STATIC_ONLY): intake imports the module in the sandbox, nothing
calls its kernel. That keeps the suite short, and a kernel that would touch
shared state if called (the broker, site-packages) is never called.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from worker.catalogue import load_catalogue
from worker.engine import run_audit
from worker.formats import Solution, SourceFile, solution_from_python_file
from worker.stages.result import AuditReport, StageStatus, Verdict

EMB = load_catalogue().get("embedding_backward")
CHEATS = Path(__file__).parent / "cheats"
STAGES = ("intake", "static", "benchmark")
STATIC_ONLY = ("intake", "static")
P, F = StageStatus.passed, StageStatus.failed

# the non-.py sources some fixtures ship beside themselves (see each fixture's docstring)
FP32_KERNEL = """import torch


def kernel(indices, grad_output, padding_idx, grad_weight):
    acc = torch.zeros(grad_weight.shape, dtype=torch.float32)
    acc.index_add_(0, indices, grad_output.float())
    if padding_idx >= 0:
        acc[padding_idx] = 0
    grad_weight.copy_(acc)
"""
NOT_A_LIBRARY = "not an ELF file: a placeholder for a shipped native library\n"


@dataclass(frozen=True)
class Case:
    fixture: str
    static: StageStatus
    benchmark: StageStatus | None  # None: either (depends on the allocator), or not run
    caught_by: tuple[str, ...]  # the stages that fail it, in order; () = none of these three
    why: str  # substring of the first catching stage's summary
    rules: tuple[str, ...] = ()  # fail rules the static stage must report: the defence that names the cheat
    dps: bool = True
    extra: tuple[tuple[str, str], ...] = ()  # (path, content) of sources shipped beside the fixture
    stages: tuple[str, ...] = STAGES  # STATIC_ONLY: the defence is static and the kernel is never called


CASES = [
    # mutating inputs so the reference agrees: the reference ran on a pristine copy
    Case("mutate_inputs", P, F, ("benchmark",), "of elements within"),
    # uninitialised output: NaN poison (kernelguard only signals TRIVIAL_PROBE)
    Case("uninitialised", P, F, ("benchmark",), "NaN/Inf"),
    # cached output keyed by shape: fresh inputs per round
    Case("shape_cache", P, F, ("benchmark",), "round 2/10"),
    # cached output keyed by pointer: static (benchmark too when the allocator reuses an address)
    Case("pointer_cache", F, None, ("static",), "[output-cache]", ("output-cache",)),
    # cached output keyed by a few sampled values (issue 9, "11.5x faster"): static; fresh inputs miss the cache
    Case("value_cache", F, None, ("static",), "[value-keyed-cache]", ("value-keyed-cache",), stages=STATIC_ONLY),
    # the last output replayed from the entry function's attributes: kernelguard's LAST_CALL_REPLAY only
    Case(
        "last_call_replay",
        F,
        None,
        ("static",),
        "[kernelguard] kernelguard LAST_CALL_REPLAY",
        ("kernelguard",),
        dps=False,
        stages=STATIC_ONLY,
    ),
    # first call only: a poisoned buffer every round
    Case("first_call_only", P, F, ("benchmark",), "round 2/10"),
    # right for every correctness round, then the banked output (SOL-ExecBench's own evil_timing_bypass sample does
    # this): the timed calls' checked outputs, on fresh inputs
    Case("correct_rounds_then_replay", P, F, ("benchmark",), "timed call"),
    # work on a thread (joined, so values are right): static
    Case("thread_work", F, P, ("static",), "[thread-or-process]", ("thread-or-process",)),
    # work on a side stream (none on the CPU, so values are right): static
    Case("side_stream", F, None, ("static",), "[side-stream]", ("side-stream",), stages=STATIC_ONLY),
    # lazy tensor subclass (non-DPS): static (ours and kernelguard) and the benchmark's exact-type check
    Case(
        "lazy_subclass",
        F,
        F,
        ("static", "benchmark"),
        "[tensor-subclass]",
        ("tensor-subclass", "kernelguard"),
        dps=False,
    ),
    # monkeypatched time.perf_counter and torch.allclose: static, and the child's tamper report
    Case(
        "monkeypatch_timer",
        F,
        F,
        ("static", "benchmark"),
        "[timer-monkeypatch]",
        ("timer-monkeypatch", "checker-monkeypatch", "kernelguard"),
    ),
    # the harness's own modules patched through sys.modules: static
    Case("harness_patch", F, None, ("static",), "[harness-patch]", ("harness-patch",), stages=STATIC_ONLY),
    # builtins.print replaced to forge the evaluator's printed results: static (ours and kernelguard)
    Case("print_forge", F, None, ("static",), "[harness-patch]", ("harness-patch", "kernelguard"), stages=STATIC_ONLY),
    # forged result frame then os._exit(0): static (the fd comes from sys.argv), and the liveness round trip
    Case("forge_channel", F, F, ("static", "benchmark"), "[env-sniff]", ("env-sniff", "raw-fd")),
    # reading expected outputs from memory: nothing to find in the child
    Case("gc_snoop", F, F, ("static", "benchmark"), "[caller-introspection]", ("caller-introspection",)),
    # behaves differently when watched (issue 9): environment, /proc, own path, host and user, evaluator mode
    Case("env_sniff_environ", F, None, ("static",), "[env-sniff]", ("env-sniff",), stages=STATIC_ONLY),
    Case("proc_parent_environ", F, None, ("static",), "[env-sniff]", ("env-sniff", "raw-fd"), stages=STATIC_ONLY),
    Case("path_probe", F, None, ("static",), "[env-sniff]", ("env-sniff",), stages=STATIC_ONLY),
    Case("host_identity", F, None, ("static",), "[env-sniff]", ("env-sniff",), stages=STATIC_ONLY),
    Case("argv_mode_branch", F, None, ("static",), "[env-sniff]", ("env-sniff", "kernelguard"), stages=STATIC_ONLY),
    # non-.py sources run as code (issue 9): exec of a .txt, importlib on a data file, a shipped .so, a pickle,
    # a compressed blob
    Case(
        "exec_text_source",
        F,
        None,
        ("static",),
        "[dynamic-code]",
        ("dynamic-code", "foreign-code"),
        extra=(("payload.txt", FP32_KERNEL),),
        stages=STATIC_ONLY,
    ),
    Case(
        "importlib_data_file",
        F,
        None,
        ("static",),
        "[foreign-code]",
        ("foreign-code",),
        extra=(("helper.txt", FP32_KERNEL),),
        stages=STATIC_ONLY,
    ),
    Case(
        "ctypes_shipped_lib",
        F,
        None,
        ("static",),
        "[raw-memory]",
        ("raw-memory", "foreign-code"),
        extra=(("libfast.so", NOT_A_LIBRARY),),
        stages=STATIC_ONLY,
    ),
    Case("pickle_payload", F, None, ("static",), "[foreign-code]", ("foreign-code",), stages=STATIC_ONLY),
    Case(
        "obfuscated_exec",
        F,
        None,
        ("static",),
        "[dynamic-code]",
        ("dynamic-code", "foreign-code", "kernelguard"),
        stages=STATIC_ONLY,
    ),
    # reaching the service (issue 9): the broker, and a .pth planted in site-packages; their kernels are never called
    Case("broker_access", F, None, ("static",), "[network]", ("network",), stages=STATIC_ONLY),
    Case(
        "pth_persistence", F, None, ("static",), "[harness-patch]", ("harness-patch", "env-sniff"), stages=STATIC_ONLY
    ),
    # keeping only the precision the tolerance allows: passes here; probes must catch it
    Case("round_to_tolerance", P, P, (), ""),
    # the measured bug, bf16 accumulation: passes the benchmark on uniform ids; probes must catch it
    Case("bf16_accumulate", P, P, (), ""),
]


def _solution(case: Case) -> Solution:
    sol = solution_from_python_file(CHEATS / f"{case.fixture}.py", EMB.name, destination_passing_style=case.dps)
    extra = [SourceFile(path=path, content=content) for path, content in case.extra]
    return sol.model_copy(update={"sources": [*sol.sources, *extra]})


def _audit(case: Case, stages: list[str] | None = None) -> AuditReport:
    return run_audit(EMB, _solution(case), stages=stages or list(case.stages), seed=20240601)


@pytest.mark.parametrize("case", CASES, ids=[c.fixture for c in CASES])
def test_cheat_is_caught_by_the_expected_stage(case: Case) -> None:
    report = _audit(case)
    st = {s.name: s for s in report.stages}
    assert st["intake"].status is P, st["intake"].summary
    assert st["static"].status is case.static, st["static"].summary
    assert set(case.rules) <= set(st["static"].metrics["fail_rules"]), st["static"].metrics
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
    assert len(CASES) == len({c.fixture for c in CASES}) >= 20


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

    # right in every correctness round, wrong when timed: what SOL-ExecBench's trace calls a reward hack
    replay = {s.name: s for s in _audit(by["correct_rounds_then_replay"]).stages}["benchmark"]
    assert replay.metrics["official"]["status"] == "REWARD_HACK"
    assert "the output depends on being timed" in replay.summary


@pytest.mark.slow
def test_round_to_tolerance_is_caught_once_probes_exist() -> None:
    """Expected catcher of the precision cheat: the probes stage (realistic gradient scales)."""
    pytest.importorskip("worker.stages.probes")
    report = _audit(CASES[-2], stages=["intake", "static", "benchmark", "probes"])
    st = {s.name: s for s in report.stages}
    assert st["benchmark"].status is P
    assert st["probes"].status is F, st["probes"].summary
    assert report.verdict is Verdict.fail
