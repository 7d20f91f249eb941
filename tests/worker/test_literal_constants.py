"""An epsilon fixed in the reference's code that the kernel hard-codes at another size: the generic probes fail it
where activations are small, and the diagnosis names the two constants (worker.probes.literal_constants)."""

from __future__ import annotations

import pytest

from tests.solution_support import BF16_RMSNORM, one_file_solution, uploaded_problem
from worker.catalogue import Problem
from worker.engine import run_audit
from worker.probes.literal_constants import constant_mismatch, small_literals
from worker.stages.result import StageStatus

KERNEL = """import torch

EPS = {eps}


def run(hidden_states, weight, output):
    x = hidden_states.float()
    output.copy_((x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight.float()).to(output.dtype))
"""


def test_small_literals_reads_python_and_c_spellings() -> None:
    assert small_literals("eps = 1e-5; b = 0.5; c = 1e-6f; d = .0001; x1e-3 = 2") == {1e-5, 1e-6, 1e-4}
    assert small_literals("tl.load(p, other=0.0); n = 4096; s = 2.0e-3F") == {2e-3}


def test_the_diagnosis_needs_a_differing_constant_on_both_sides() -> None:
    ref = "EPS = 1e-5"
    assert constant_mismatch(ref, ["eps = 1e-6"], ["p"]) is not None
    assert constant_mismatch(ref, ["eps = 0.00001"], ["p"]) is None  # the same constant, spelled otherwise
    assert constant_mismatch(ref, ["const float eps = 1e-5f; float tiny = 1e-12f;"], ["p"]) is None
    assert constant_mismatch(ref, ["eps = 10 ** -6"], ["p"]) is None  # no literal to compare: no claim
    assert constant_mismatch("def run(x, eps): ...", ["eps = 1e-6"], ["p"]) is None  # the reference fixes none


@pytest.fixture(scope="module")
def problem(tmp_path_factory: pytest.TempPathFactory) -> Problem:
    return uploaded_problem(tmp_path_factory.mktemp("up"), BF16_RMSNORM, [{"batch_size": 1}, {"batch_size": 33}])


def _probes(problem: Problem, eps: str) -> tuple[StageStatus, list[str], str]:
    solution = one_file_solution(problem.name, KERNEL.format(eps=eps), dps=True)
    report = run_audit(problem, solution, stages=["intake", "benchmark", "probes"], seed=5)
    bench = next(s for s in report.stages if s.name == "benchmark")
    assert bench.status is StageStatus.passed, bench.summary  # the benchmark's own inputs never reach the regime
    probes = next(s for s in report.stages if s.name == "probes")
    verdict = next(s for s in report.stages if s.name == "verdict")
    return probes.status, list(probes.metrics.get("diagnosis") or []), verdict.summary


def test_a_hard_coded_epsilon_of_another_size_is_caught_and_named(problem: Problem) -> None:
    status, diagnosis, verdict = _probes(problem, "1e-6")
    assert status is StageStatus.failed
    assert diagnosis[0].startswith("the reference's constant 1e-05 appears nowhere in the kernel's sources")
    assert "which write 1e-06" in diagnosis[0] and "scale_0.0001:hidden_states" in diagnosis[0]
    assert "diagnosis: the reference's constant 1e-05" in verdict  # the first diagnosis is the verdict's


def test_the_definitions_epsilon_passes_without_that_diagnosis(problem: Problem) -> None:
    status, diagnosis, _ = _probes(problem, "1e-5")
    assert status is StageStatus.passed
    assert not any("appears nowhere" in d for d in diagnosis)
