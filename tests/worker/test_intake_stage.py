"""Intake alone catches what can be told before running anything: wrong definition, missing or
mis-shaped entry point, a file that does not import, a compiled C++ language (not built yet), a GPU-only
language on a CPU audit. Later stages are skipped. It also shows how the file was read (compat notes)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from worker.catalogue import load_catalogue
from worker.engine import run_audit
from worker.formats import Language, Solution, SolutionSpec, SourceFile
from worker.stages.intake import DSL_PACKAGES, missing_dsl_packages
from worker.stages.result import StageStatus, Verdict

GOOD = "import torch\n\ndef run(indices, grad_output, num_embeddings, padding_idx, grad_weight):\n    grad_weight.zero_()\n"


def _solution(
    content: str,
    *,
    definition: str = "embedding_backward",
    languages: list[Language] | None = None,
    entry: str = "k.py::run",
    dps: bool = True,
) -> Solution:
    return Solution.model_validate(
        {
            "name": "t",
            "definition": definition,
            "spec": {"languages": languages or ["pytorch"], "entry_point": entry, "destination_passing_style": dps},
            "sources": [{"path": entry.split("::")[0], "content": content}],
        }
    )


CPP = "#include <torch/extension.h>\nvoid run(torch::Tensor i, torch::Tensor g, int64_t n, int64_t p, torch::Tensor w) {}\n"


@pytest.mark.parametrize(
    ("solution", "status", "needle"),
    [
        (_solution(GOOD, definition="rmsnorm_forward"), StageStatus.failed, "expected 'embedding_backward'"),
        (_solution(GOOD, entry="k.py::forward"), StageStatus.failed, "entry point 'forward' is not defined"),
        (
            _solution("def run(indices, grad_output):\n    pass\n"),
            StageStatus.failed,
            "takes 2 positional arguments; the definition needs 5",
        ),
        (_solution("def run(:\n"), StageStatus.failed, "syntax error"),
        (_solution("import no_such_module_kaudit\n" + GOOD), StageStatus.failed, "does not import"),
        # compiled on a GPU worker only (worker.compile_step); a CPU audit refuses before building anything
        (
            _solution(CPP, languages=["cuda_cpp"], entry="k.cu::run"),
            StageStatus.error,
            "['cuda_cpp'] run only on an NVIDIA GPU (CUDA), and this audit runs on cpu",
        ),
        (
            _solution(CPP, languages=["cublas"], entry="k.cpp::run"),
            StageStatus.error,
            "['cublas'] run only on an NVIDIA GPU (CUDA), and this audit runs on cpu",
        ),
        (
            _solution(GOOD, languages=["cute_dsl"]),
            StageStatus.error,
            "['cute_dsl'] run only on an NVIDIA GPU (CUDA), and this audit runs on cpu",
        ),
        (
            _solution(GOOD, languages=["cutile"]),
            StageStatus.error,
            "['cutile'] run only on an NVIDIA GPU (CUDA), and this audit runs on cpu",
        ),
        (
            _solution(GOOD, languages=["cudnn_frontend", "pytorch"]),
            StageStatus.error,
            "['cudnn_frontend'] run only on an NVIDIA GPU (CUDA), and this audit runs on cpu",
        ),
    ],
    ids=[
        "wrong-definition",
        "missing-entry",
        "arity",
        "syntax",
        "import-error",
        "cuda_cpp",
        "cublas",
        "cute_dsl-on-cpu",
        "cutile-on-cpu",
        "cudnn_frontend-on-cpu",
    ],
)
def test_intake_fails_alone_and_later_stages_are_skipped(solution: Solution, status: StageStatus, needle: str) -> None:
    problem = load_catalogue().get("embedding_backward")
    report = run_audit(problem, solution, stages=["intake", "static", "benchmark"])
    st = {s.name: s for s in report.stages}
    assert st["intake"].status is status and needle in st["intake"].summary, st["intake"].summary
    assert all(st[n].status is StageStatus.skipped for n in ("static", "benchmark", "probes", "canary"))
    assert report.verdict is (Verdict.fail if status is StageStatus.failed else Verdict.error)
    assert st["intake"].summary in report.summary and report.stages[-1].metrics["caught_by"] == (
        ["intake"] if status is StageStatus.failed else []
    )


def test_value_returning_entry_point_needs_only_inputs() -> None:
    problem = load_catalogue().get("embedding_backward")
    sol = _solution("def run(indices, grad_output, num_embeddings, padding_idx):\n    return None\n", dps=False)
    report = run_audit(problem, sol, stages=["intake"])
    assert report.stages[0].status is StageStatus.passed, report.stages[0].summary


def test_the_older_form_passes_with_its_compat_note_in_the_report() -> None:
    problem = load_catalogue().get("embedding_backward")
    older = Solution.model_validate(
        {
            "name": "t",
            "definition": "embedding_backward",
            "spec": {"language": "python", "target_hardware": ["cpu", "cuda"], "entry_point": "k.py::run"},
            "sources": [{"path": "k.py", "content": GOOD}],
        }
    )
    (intake,) = run_audit(problem, older, stages=["intake"]).stages[:1]
    assert intake.status is StageStatus.passed, intake.summary
    assert "compat note" in intake.summary and "spec.language 'python'" in intake.summary
    assert intake.evidence["compat_notes"] == older.compat_notes and intake.evidence["languages"] == ["pytorch"]
    official = _solution(GOOD)
    (intake,) = run_audit(problem, official, stages=["intake"]).stages[:1]
    assert (
        intake.status is StageStatus.passed and "compat" not in intake.summary and "compat_notes" not in intake.evidence
    )


def test_the_sandbox_refuses_a_path_alias_the_model_was_bypassed_for() -> None:
    """`k.py` clean and `k.py/` written over it: the child writes only canonical, distinct paths (the model refuses
    the pair; model_construct skips the model, so the child's own check is what holds here)."""
    problem = load_catalogue().get("embedding_backward")
    forged = Solution.model_construct(
        name="alias",
        definition="embedding_backward",
        author="",
        description="",
        compat_notes=[],
        spec=SolutionSpec(languages=["pytorch"], entry_point="k.py::run"),
        sources=[
            SourceFile(path="k.py", content=GOOD),
            SourceFile.model_construct(path="k.py/", content="raise SystemExit\n"),
        ],
    )
    (intake,) = run_audit(problem, forged, stages=["intake"]).stages[:1]
    assert intake.status is StageStatus.failed and "not in canonical form: 'k.py/'" in intake.summary, intake.summary


def _have(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


HAVE_CUTE_DSL = _have(DSL_PACKAGES["cute_dsl"].module)
# a trivial CuTe DSL solution: a Python module that imports its DSL, then does the work in torch
CUTE_DSL_MODULE = "import cutlass\nimport cutlass.cute as cute\n\n" + GOOD


@pytest.mark.skipif(HAVE_CUTE_DSL, reason="this worker has the CuTe DSL: nothing is missing")
def test_a_missing_dsl_package_is_named_with_what_to_install() -> None:
    (line,) = missing_dsl_packages(["pytorch", "cute_dsl"])
    assert line.startswith("cute_dsl needs the CuTe DSL (Python module 'cutlass')"), line
    assert "install nvidia-cutlass-dsl" in line and "`gpu` extra (pip install 'kernel-audit[gpu]')" in line, line
    assert missing_dsl_packages(["pytorch", "triton"]) == []  # installed with kernel-audit itself


@pytest.mark.skipif(HAVE_CUTE_DSL, reason="this worker has the CuTe DSL: the import succeeds")
def test_a_load_error_naming_a_dsl_module_says_which_package_to_install() -> None:
    """Declared as pytorch, so it loads on the CPU: its import of the CuTe DSL fails in the sandbox, and the error
    names the package and the extra that provide it."""
    problem = load_catalogue().get("embedding_backward")
    (intake,) = run_audit(problem, _solution(CUTE_DSL_MODULE), stages=["intake"]).stages[:1]
    assert intake.status is StageStatus.failed, intake.summary
    assert "No module named 'cutlass'" in intake.summary, intake.summary
    assert "nvidia-cutlass-dsl" in intake.summary and "kernel-audit[gpu]" in intake.summary, intake.summary


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cute_dsl_module_loads_on_cuda_like_a_pytorch_one() -> None:
    problem = load_catalogue().get("embedding_backward")
    (intake,) = run_audit(
        problem, _solution(CUTE_DSL_MODULE, languages=["cute_dsl"]), device="cuda", stages=["intake"]
    ).stages[:1]
    if HAVE_CUTE_DSL:
        assert intake.status is StageStatus.passed, intake.summary
        assert intake.evidence["languages"] == ["cute_dsl"] and "entry point imports" in intake.summary
    else:  # a GPU worker set up without the `gpu` extra: inconclusive, and it says what to install
        assert intake.status is StageStatus.error, intake.summary
        assert "nvidia-cutlass-dsl" in intake.summary and "kernel-audit[gpu]" in intake.summary, intake.summary
