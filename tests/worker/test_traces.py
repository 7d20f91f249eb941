"""SOL-ExecBench traces out of real audits (worker.traces): one per evaluated workload, the status the benchmark's
own evaluator would record, fields as the official schema requires them for that status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker.catalogue import Problem
from worker.engine import run_audit
from worker.formats import Solution
from worker.formats.bundle import DefinitionBundle
from worker.traces import EvaluationStatus, Trace, to_jsonl, traces_of
from worker.uploaded import problem_from_bundle

REFERENCE = "import torch\n\n\ndef run(x, scale):\n    return (x.float() * scale).sum(-1)\n"
DEFINITION = {
    "name": "trace_rowsum",
    "description": "Sum of each row of x times a scalar.",
    "axes": {"rows": {"type": "var"}, "cols": {"type": "var"}},
    "inputs": {"x": {"shape": ["rows", "cols"], "dtype": "float32"}, "scale": {"shape": None, "dtype": "float32"}},
    "outputs": {"out": {"shape": ["rows"], "dtype": "float32"}},
    "reference": REFERENCE,
}
WORKLOADS = [
    {
        "uuid": f"w{r}",
        "axes": {"rows": r, "cols": 64},
        "inputs": {"x": {"type": "random"}, "scale": {"type": "scalar", "value": 0.5}},
    }
    for r in (8, 16, 32)
]


@pytest.fixture(scope="module")
def problem(tmp_path_factory: pytest.TempPathFactory) -> Problem:
    bundle = DefinitionBundle.model_validate({"definition": DEFINITION, "workloads": WORKLOADS})
    return problem_from_bundle(bundle, tmp_path_factory.mktemp("uploads"), trusted_reference=True)


def _solution(body: str) -> Solution:
    return Solution.model_validate(
        {
            "name": "candidate",
            "definition": DEFINITION["name"],
            "spec": {"language": "python", "entry_point": "k.py::run", "destination_passing_style": False},
            "sources": [{"path": "k.py", "content": body}],
        }
    )


def _traces(problem: Problem, body: str) -> list[Trace]:
    solution = _solution(body)
    report = run_audit(problem, solution, stages=["intake", "static", "benchmark"], seed=5)
    traces = traces_of(report, solution, list(problem.workloads("cpu")))
    # every line round-trips through the official schema's own rules
    for line in to_jsonl(traces).splitlines():
        Trace.model_validate(json.loads(line))
    return traces


def test_a_correct_kernel_passes_every_workload_and_the_timed_one_has_its_latency(problem: Problem) -> None:
    traces = _traces(problem, "def run(x, scale):\n    return (x * scale).sum(-1)\n")
    assert [t.workload["uuid"] for t in traces] == ["w8", "w16", "w32"]
    assert {t.evaluation.status for t in traces if t.evaluation} == {EvaluationStatus.PASSED}
    timed = [t for t in traces if t.evaluation and t.evaluation.performance and t.evaluation.performance.latency_ms > 0]
    assert [t.workload["uuid"] for t in timed] == ["w32"], "the largest workload is the one timed"
    e = traces[0].evaluation
    assert e is not None and e.environment.hardware.startswith("CPU_") and "torch" in e.environment.libs
    assert e.correctness is not None and e.correctness.max_absolute_error < 1e-4


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ("def run(x, scale):\n    return (x * scale).sum(-1) * 1.5\n", EvaluationStatus.INCORRECT_NUMERICAL),
        ("def run(x, scale):\n    return (x * scale).sum(-1, keepdim=True)\n", EvaluationStatus.INCORRECT_SHAPE),
        ("def run(x, scale):\n    return (x * scale).sum(-1).double()\n", EvaluationStatus.INCORRECT_DTYPE),
        ("def run(x, scale):\n    raise RuntimeError('boom')\n", EvaluationStatus.RUNTIME_ERROR),
        ("def run(x, scale)\n    return x\n", EvaluationStatus.COMPILE_ERROR),
        (
            "import threading\n\ndef run(x, scale):\n    threading.Thread(target=print).start()\n    return (x * scale).sum(-1)\n",
            EvaluationStatus.REWARD_HACK,
        ),
    ],
)
def test_a_bad_kernel_gets_the_status_sol_execbench_would_record(
    problem: Problem, body: str, status: EvaluationStatus
) -> None:
    traces = _traces(problem, body)
    assert traces, "every audited workload has a trace"
    assert traces[-1].evaluation is not None and traces[-1].evaluation.status is status, traces[-1].evaluation
    assert traces[-1].evaluation.log, "a failure says why"
    if status in (EvaluationStatus.INCORRECT_SHAPE, EvaluationStatus.INCORRECT_DTYPE, EvaluationStatus.RUNTIME_ERROR):
        assert traces[-1].evaluation.correctness is None and traces[-1].evaluation.performance is None


def test_the_schema_refuses_fields_a_status_does_not_allow() -> None:
    from worker.traces import Correctness, Environment, Evaluation, Performance

    env = Environment(hardware="X")
    with pytest.raises(ValueError, match="performance required"):
        Evaluation(status=EvaluationStatus.PASSED, environment=env, timestamp="t", correctness=Correctness())
    with pytest.raises(ValueError, match="correctness not allowed"):
        Evaluation(status=EvaluationStatus.TIMEOUT, environment=env, timestamp="t", correctness=Correctness())
    Evaluation(status=EvaluationStatus.INCORRECT_NUMERICAL, environment=env, timestamp="t", correctness=Correctness())
    with pytest.raises(ValueError):
        Evaluation(
            status=EvaluationStatus.INCORRECT_NUMERICAL,
            environment=env,
            timestamp="t",
            correctness=Correctness(),
            performance=Performance(),
        )


def test_no_traces_for_workloads_never_evaluated(problem: Problem, tmp_path: Path) -> None:
    """An audit run without the benchmark stage evaluated nothing SOL-ExecBench would: no traces."""
    solution = _solution("def run(x, scale):\n    return (x * scale).sum(-1)\n")
    report = run_audit(problem, solution, stages=["intake", "static"], seed=5)
    assert traces_of(report, solution, list(problem.workloads("cpu"))) == []
