"""Intake alone catches what can be told before running anything: wrong definition, missing or
mis-shaped entry point, a file that does not import, an unsupported language. Later stages are skipped."""

from __future__ import annotations

import pytest

from worker.catalogue import load_catalogue
from worker.engine import run_audit
from worker.formats import Solution
from worker.stages.result import StageStatus, Verdict

GOOD = "import torch\n\ndef run(indices, grad_output, num_embeddings, padding_idx, grad_weight):\n    grad_weight.zero_()\n"


def _solution(content: str, *, definition: str = "embedding_backward", language: str = "python",
              entry: str = "k.py::run", dps: bool = True) -> Solution:
    return Solution.model_validate({
        "name": "t", "definition": definition,
        "spec": {"language": language, "entry_point": entry, "destination_passing_style": dps},
        "sources": [{"path": "k.py", "content": content}],
    })


@pytest.mark.parametrize(
    ("solution", "status", "needle"),
    [
        (_solution(GOOD, definition="rmsnorm_forward"), StageStatus.failed, "expected 'embedding_backward'"),
        (_solution(GOOD, entry="k.py::forward"), StageStatus.failed, "entry point 'forward' is not defined"),
        (_solution("def run(indices, grad_output):\n    pass\n"), StageStatus.failed, "takes 2 positional arguments; the definition needs 5"),
        (_solution("def run(:\n"), StageStatus.failed, "syntax error"),
        (_solution("import no_such_module_kaudit\n" + GOOD), StageStatus.failed, "does not import"),
        (_solution(GOOD, language="cuda"), StageStatus.error, "not supported yet"),
    ],
    ids=["wrong-definition", "missing-entry", "arity", "syntax", "import-error", "cuda"],
)
def test_intake_fails_alone_and_later_stages_are_skipped(solution: Solution, status: StageStatus, needle: str) -> None:
    problem = load_catalogue().get("embedding_backward")
    report = run_audit(problem, solution, stages=["intake", "static", "benchmark"])
    st = {s.name: s for s in report.stages}
    assert st["intake"].status is status and needle in st["intake"].summary, st["intake"].summary
    assert all(st[n].status is StageStatus.skipped for n in ("static", "benchmark", "probes", "canary"))
    assert report.verdict is (Verdict.fail if status is StageStatus.failed else Verdict.error)
    assert "caught by intake" in report.summary


def test_value_returning_entry_point_needs_only_inputs() -> None:
    problem = load_catalogue().get("embedding_backward")
    sol = _solution("def run(indices, grad_output, num_embeddings, padding_idx):\n    return None\n", dps=False)
    report = run_audit(problem, sol, stages=["intake"])
    assert report.stages[0].status is StageStatus.passed, report.stages[0].summary
