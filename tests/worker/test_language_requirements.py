"""A language the worker's GPU or toolchain cannot run ends intake `error` naming the requirement (cuTile needs a
Blackwell GPU and CUDA 13.1's tileiras), not `fail` at the kernel's first call."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from worker.language_requirements import DeviceFacts, find_tool, unmet_requirements

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "solexecbench"
H200 = DeviceFacts("NVIDIA H200", (9, 0))
B200 = DeviceFacts("NVIDIA B200", (10, 0))


def _found(name: str) -> str:
    return f"/opt/cuda/bin/{name}"


def _absent(name: str) -> None:
    return None


def test_cutile_on_a_hopper_names_the_gpu_it_needs_and_the_one_it_has() -> None:
    unmet = unmet_requirements(["cutile"], H200, _found)
    assert len(unmet) == 1
    assert "compute capability 10.x or 12.x" in unmet[0]
    assert "NVIDIA H200 (compute capability 9.0)" in unmet[0]


def test_cutile_on_a_blackwell_without_tileiras_names_the_toolkit() -> None:
    unmet = unmet_requirements(["cutile"], B200, _absent)
    assert len(unmet) == 1 and "'tileiras'" in unmet[0] and "13.1" in unmet[0]


def test_cutile_on_a_blackwell_with_tileiras_and_other_languages_anywhere_pass() -> None:
    assert unmet_requirements(["cutile"], DeviceFacts("RTX 5090", (12, 0)), _found) == []
    assert unmet_requirements(["pytorch", "triton", "cuda_cpp", "cute_dsl"], H200, _absent) == []


def test_find_tool_looks_in_cuda_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "tileiras-test-tool").write_text("")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert find_tool("tileiras-test-tool") == str(tmp_path / "bin" / "tileiras-test-tool")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nowhere"))
    assert find_tool("tileiras-test-tool") is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cutile_audit_on_a_gpu_it_cannot_target_is_an_error_naming_it() -> None:
    if torch.cuda.get_device_capability(0)[0] in (10, 12):
        pytest.skip("this GPU is one cuTile targets")
    from worker.catalogue import load_problem
    from worker.engine import run_audit
    from worker.formats import load_solution

    problem = load_problem(FIXTURES)
    problem = dataclasses.replace(
        problem,
        workloads_gpu=tuple(
            w for w in problem.workloads_gpu if not any(i.type == "safetensors" for i in w.inputs.values())
        ),
    )
    report = run_audit(
        problem, load_solution(FIXTURES / "solution_cutile.json"), device="cuda", stages=("intake", "benchmark")
    )
    intake = {s.name: s for s in report.stages}["intake"]
    assert str(intake.status) == "error", intake.summary
    assert "compute capability 10.x or 12.x" in intake.summary or "tileiras" in intake.summary
