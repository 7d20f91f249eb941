"""A definition's float constants (an eps, a scale) are probed at other values: a kernel that hard-codes the
benchmark's value passes every workload and is wrong everywhere else.

The problem is the catalogue's RMSNorm forward with its audit.json and oracle.py set aside, so the generic path
derives the probes; its workloads pass eps 1e-6 and 1e-5 as a scalar input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from worker.catalogue import load_problem
from worker.context import AuditContext
from worker.formats import Solution
from worker.generic.spec import derive_plan, moved_scalar
from worker.reference import Reference
from worker.stages import probes as probes_stage
from worker.stages.result import StageStatus

KERNELS = Path(__file__).resolve().parents[2] / "kernels" / "rmsnorm_forward"
CORRECT = (
    "import torch\n\n\ndef run(input, weight, eps, output):\n    x = input.float()\n"
    "    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)\n    output.copy_(x * rstd * weight.float())\n"
)
HARD_CODED = CORRECT.replace("+ eps)", "+ 1e-6)")  # the workload's eps, not the argument


@pytest.fixture(scope="module")
def uncurated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("rmsnorm_forward_uncurated")
    for name in ("definition.json", "workload.jsonl", "workload_cpu.jsonl"):
        shutil.copy(KERNELS / name, folder / name)
    return folder


def _solution(source: str) -> Solution:
    doc = json.loads((KERNELS / "solutions" / "pytorch" / "solution.json").read_text())
    doc["sources"] = [{"path": "kernel.py", "content": source}]
    return Solution.model_validate(doc)


def _probes(folder: Path, source: str):  # type: ignore[no-untyped-def]
    problem = load_problem(folder)
    ctx = AuditContext(problem=problem, solution=_solution(source), seed=7)
    try:
        return probes_stage.run(ctx)
    finally:
        ctx.close()


def test_the_plan_moves_eps_into_the_regime_where_it_matters(uncurated: Path) -> None:
    problem = load_problem(uncurated)
    plan = derive_plan(problem.definition, problem.workloads("cpu"), "cpu", 1, Reference.of(problem.definition))
    probe = next(p for p in plan.spec.probes if p.name == "constant:eps")
    moved = probe.inputs["eps"].params["value"]
    assert moved in (pytest.approx(1e-4), pytest.approx(1e-3))  # 100x the base workload's eps (1e-6 or 1e-5)
    assert probe.inputs["input"].params["std"] == pytest.approx(moved**0.5)  # x^2 of the eps's size
    assert moved_scalar(0.5) == 1.0 and moved_scalar(0.0) == 1e-3


def test_a_kernel_that_hard_codes_eps_is_caught_and_an_honest_one_passes(uncurated: Path) -> None:
    bad = _probes(uncurated, HARD_CODED)
    assert bad.status is StageStatus.failed, bad.summary
    assert [n for n, p in bad.metrics["probes"].items() if not p["passed"]] == ["constant:eps"]
    good = _probes(uncurated, CORRECT)
    assert good.status is StageStatus.passed, good.summary
    assert good.metrics["probes"]["constant:eps"]["passed"] is True
