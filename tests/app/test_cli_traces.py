"""`kaudit audit --traces FILE`: one SOL-ExecBench trace per evaluated workload, as JSON lines, from a real CPU audit."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from app.cli import app
from worker.catalogue import load_catalogue
from worker.traces import EvaluationStatus, Trace

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
CORRECT = KERNELS / "embedding_backward/solutions/pytorch_fp32"
# right signature, wrong result: zero gradients
WRONG = "def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):\n    grad_weight.zero_()\n"
STAGES = "intake,static,benchmark"


def _traces(path: Path) -> list[Trace]:
    lines = path.read_text().splitlines()
    return [Trace.model_validate(json.loads(line)) for line in lines]


def test_a_correct_solution_writes_one_passed_trace_per_cpu_workload(tmp_path: Path) -> None:
    out = tmp_path / "traces.jsonl"
    r = CliRunner().invoke(
        app, ["audit", str(CORRECT), "--stages", STAGES, "--json", "--traces", str(out), "--seed", "3"]
    )
    assert r.exit_code == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["verdict"] == "pass"  # stdout stays one JSON object; the count goes to stderr
    workloads = load_catalogue().get("embedding_backward").workloads_cpu
    traces = _traces(out)
    assert [t.workload["uuid"] for t in traces] == [w.uuid for w in workloads]
    assert {t.definition for t in traces} == {"embedding_backward"} and {t.solution for t in traces} == {"pytorch_fp32"}
    assert all(t.evaluation is not None and t.evaluation.status is EvaluationStatus.PASSED for t in traces)
    assert f"traces: {len(workloads)} of {len(workloads)} workload(s) written to {out}" in " ".join(r.stderr.split())


def test_a_wrong_solution_s_traces_say_where_it_failed(tmp_path: Path) -> None:
    kernel = tmp_path / "zeros.py"
    kernel.write_text(WRONG)
    out = tmp_path / "traces.jsonl"
    r = CliRunner().invoke(
        app, ["audit", str(kernel), "-d", "embedding_backward", "--stages", STAGES, "--traces", str(out), "--seed", "3"]
    )
    assert r.exit_code == 1, r.stdout + r.stderr
    (first, *rest) = _traces(out)  # the benchmark stops at the first failing workload: the rest were not evaluated
    assert first.evaluation is not None and first.evaluation.status is EvaluationStatus.INCORRECT_NUMERICAL
    assert first.workload["uuid"] == load_catalogue().get("embedding_backward").workloads_cpu[0].uuid and rest == []
    assert "(the rest were not evaluated)" in " ".join(r.stderr.split())


def test_a_traces_path_that_cannot_be_written_is_refused_before_the_audit(tmp_path: Path) -> None:
    for bad in (tmp_path, tmp_path / "no_such_folder" / "t.jsonl"):
        r = CliRunner().invoke(app, ["audit", str(CORRECT), "--stages", STAGES, "--traces", str(bad)])
        assert r.exit_code == 2 and "--traces" in r.stderr and "existing folder" in r.stderr, r.stderr
        assert "intake:" not in r.stderr  # no stage ran
