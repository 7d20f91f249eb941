"""Nothing derived from an uploaded definition executes in the trusted worker process.

An uploaded definition's reference is the uploader's code. Each path that reads or runs it (the generic plan, the
structure it is read from, custom inputs, the reference in the benchmark, probes and canary stages, axis
expressions; the canary's parent warm-up is tests/worker/test_parent_warm.py's) is driven here with a hostile reference that, wherever it runs, writes a marker file into
this test's own folder with the environment it sees, and shifts its outputs when it can see the parent's secret.
In the sandbox the write lands in the child's private /tmp and the secret is not in its environment: no marker
here, no shifted output. Each test also shows the hostile reference does plant its marker when run trusted, so a
missing marker means isolation, not a broken attack.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from worker.catalogue import Problem, load_problem
from worker.engine import run_audit
from worker.formats import Definition, Solution, expr
from worker.formats.bundle import DefinitionBundle
from worker.generic.spec import derive_plan
from worker.inputs import build_case
from worker.reference import Reference
from worker.sandbox import namespaces_available
from worker.sandboxed_reference import SandboxedReference
from worker.stages.result import StageStatus
from worker.uploaded import problem_from_bundle

pytestmark = pytest.mark.skipif(not namespaces_available(), reason="bubblewrap namespaces are not available here")

SECRET_NAME = "KAUDIT_TRUST_TEST_SECRET"

HOSTILE = """import os
import torch

MARK = {marker!r}


def _plant(where):
    try:
        with open(MARK + "-" + where, "w") as f:
            f.write(repr(dict(os.environ)))
    except OSError:
        pass


_plant("module")
SAW = os.environ.get({secret!r})


def run(x, scale):
    _plant("run")
    out = (x.float() * scale).sum(-1)
    return out + 1.0 if SAW else out


def make_inputs(axes_and_scalars, device):
    _plant("custom")
    return {{"x": torch.randn(axes_and_scalars["rows"], axes_and_scalars["cols"], device=device)}}
"""


def _definition(marker: Path, *, custom: bool = False, name: str = "uploaded_hostile_rowsum") -> Definition:
    return Definition.model_validate(
        {
            "name": name,
            "description": "Sum of each row of x times a scalar, in fp32.",
            "axes": {
                "rows": {"type": "var"},
                "cols": {"type": "var"},
                "twice": {"type": "expr", "expression": "rows * 2"},
            },
            "inputs": {
                "x": {"shape": ["rows", "cols"], "dtype": "float32"},
                "scale": {"shape": None, "dtype": "float32"},
            },
            "outputs": {"out": {"shape": ["rows"], "dtype": "float32"}},
            "reference": HOSTILE.format(marker=str(marker), secret=SECRET_NAME),
            **({"custom_inputs_entrypoint": "make_inputs"} if custom else {}),
        }
    )


def _workloads(custom: bool = False) -> list[dict[str, object]]:
    x = {"type": "custom"} if custom else {"type": "random"}
    return [
        {
            "uuid": f"w-{r}-{c}",
            "axes": {"rows": r, "cols": c},
            "inputs": {"x": x, "scale": {"type": "scalar", "value": 0.5}},
        }
        for r, c in ((16, 32), (24, 64), (32, 96))
    ]


def _uploaded(tmp_path: Path, marker: Path, *, custom: bool = False) -> Problem:
    d = _definition(marker, custom=custom)
    bundle = DefinitionBundle.model_validate({"definition": d.model_dump(mode="json"), "workloads": _workloads(custom)})
    return problem_from_bundle(bundle, tmp_path / "uploads")


def _planted(marker: Path) -> list[str]:
    return sorted(p.name for p in marker.parent.glob(marker.name + "-*"))


@pytest.fixture
def marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Where a hostile reference plants its marker; the parent's environment carries a secret."""
    monkeypatch.setenv(SECRET_NAME, secrets.token_hex(16))
    folder = tmp_path / "outside"
    folder.mkdir()
    folder.chmod(0o777)  # writable by anyone: only the sandbox's mount namespace keeps the child out
    yield folder / "marker"


def test_the_hostile_reference_plants_its_marker_when_trusted(marker: Path) -> None:
    """The control: run as a trusted Reference, the same source plants its marker and sees the secret."""
    ref = Reference.of(_definition(marker, custom=True))
    out = ref.run([torch.ones(2, 3), 1.0])[0]
    assert _planted(marker) == ["marker-module", "marker-run"]
    assert torch.equal(out, torch.full((2,), 4.0)), (
        "the hostile reference did not see the secret in the trusted process"
    )


def test_sandboxed_reference_runs_custom_inputs_and_run_without_marker_or_secret(marker: Path) -> None:
    d = _definition(marker, custom=True)
    ref = SandboxedReference(d, "cpu", timeout_s=120)
    try:
        case = build_case(d, ref, Workload_of(_workloads(custom=True)[0]), seed=7)
        x = case.inputs["x"]
        assert x.shape == (16, 32)
        again = build_case(d, ref, Workload_of(_workloads(custom=True)[0]), seed=7).inputs["x"]
        assert torch.equal(x, again), "custom inputs are seeded in the sandbox"
        out = ref.run([x, 0.5])[0]
        assert torch.allclose(out, (x * 0.5).sum(-1)), "the reference saw the parent's secret"
    finally:
        ref.close()
    assert _planted(marker) == []


def Workload_of(raw: dict[str, object]):  # type: ignore[no-untyped-def]  # reads like the type it builds
    from worker.formats import Workload

    return Workload.model_validate(raw)


@pytest.mark.parametrize("custom", [False, True], ids=["random_inputs", "custom_inputs"])
def test_generic_plan_reads_structure_through_the_sandbox(tmp_path: Path, marker: Path, custom: bool) -> None:
    """derive_plan builds a small case (custom inputs) and reads the structure (promoted reference runs) in the
    reference's sandbox: the plan still finds the reduced axis, and nothing ran here."""
    problem = _uploaded(tmp_path, marker, custom=custom)
    assert not problem.reference_trusted
    ref = SandboxedReference(problem.definition, "cpu", timeout_s=120)
    try:
        plan = derive_plan(problem.definition, problem.workloads("cpu"), "cpu", seed=3, reference=ref)
    finally:
        ref.close()
    assert plan.structure.reduced_axes == ["cols"], plan.structure.note
    assert _planted(marker) == []


def test_every_stage_of_an_uploaded_problem_runs_its_reference_sandboxed(tmp_path: Path, marker: Path) -> None:
    """intake, static, benchmark, probes and canary on an uploaded problem, with a correct kernel: the verdict is
    the kernel's (a reference that saw the secret would fail it by 1.0), and no marker was planted anywhere."""
    problem = _uploaded(tmp_path, marker)
    solution = Solution.model_validate(
        {
            "name": "rowsum",
            "definition": problem.name,
            "spec": {"language": "python", "entry_point": "k.py::run", "destination_passing_style": False},
            "sources": [{"path": "k.py", "content": "def run(x, scale):\n    return (x.float() * scale).sum(-1)\n"}],
        }
    )
    report = run_audit(
        problem,
        solution,
        device="cpu",
        stages=["intake", "static", "benchmark", "probes", "canary"],
        seed=11,
        isolation="namespaces",
    )
    statuses = {s.name: s.status for s in report.stages}
    assert statuses["benchmark"] == StageStatus.passed, report.stages
    assert statuses["probes"] == StageStatus.passed, [s.summary for s in report.stages]
    verdict = report.stages[-1]
    assert str(verdict.metrics["sandbox_memory"]).split(" bytes")[0].isdigit(), verdict.metrics["sandbox_memory"]
    assert _planted(marker) == []


@pytest.mark.parametrize(
    "expression",
    [
        "9**9**7 * 0 + 4096",
        "2**10**10",
        "(rows * 99999999999) ** 3",
        "'a' * 10**8",
        "__import__('os').getpid()",
        "[rows] * 10**9",
        "(lambda: 1)()",
        "rows.bit_length()",
        "+" * 600 + "1",
    ],
)
def test_hostile_axis_expressions_are_refused_quickly(expression: str) -> None:
    """Refused by the schema (or bounded at evaluation by the evaluator's integer and operation limits), never run
    by `eval`: `9**9**7` would hold the worker in one C call for 40 s, which pytest's timeout would catch."""
    with pytest.raises((ValueError, ArithmeticError)):
        d = Definition.model_validate(
            {
                "name": "expr_bomb",
                "axes": {"rows": {"type": "var"}, "big": {"type": "expr", "expression": expression}},
                "inputs": {"x": {"shape": ["rows"], "dtype": "float32"}},
                "outputs": {"y": {"shape": ["big"], "dtype": "float32"}},
                "reference": "def run(x):\n    return x\n",
            }
        )
        d.resolve_axes({"rows": 4})


def test_axis_expressions_still_evaluate() -> None:
    assert expr.evaluate("rows * 2 + cols // 4", {"rows": 3, "cols": 10}) == 8
    assert expr.evaluate("rows % 128 == 0 and cols >= 2", {"rows": 256, "cols": 2}) is True
    assert expr.evaluate("2 ** 62", {}) == 2**62
    with pytest.raises(expr.ExpressionError):
        expr.evaluate("2 ** 64", {})
    with pytest.raises(expr.UnknownName):
        expr.evaluate("rows + other", {"rows": 1})


def test_catalogue_problem_still_runs_its_reviewed_reference_here(tmp_path: Path, marker: Path) -> None:
    """The trust is the problem's, not the definition's: the same folder loaded as a catalogue problem is trusted,
    as uploaded it is not (worker.uploaded)."""
    problem = _uploaded(tmp_path, marker)
    assert load_problem(problem.folder).reference_trusted
    assert not problem.reference_trusted
