"""`kaudit`: exit codes, the --json shape, the .py shorthand, and clear errors on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import app

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
KAUDIT = [sys.executable, "-m", "app.cli"]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "solexecbench"


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KAUDIT, *args], capture_output=True, text=True, timeout=timeout)


def test_problems_lists_the_catalogue() -> None:
    r = _run("problems", "--json")
    assert r.returncode == 0, r.stderr
    names = {p["name"] for p in json.loads(r.stdout)}
    # every problem folder under kernels/ (the catalogue grows), the five original ones among them
    assert names == {d.parent.name for d in KERNELS.glob("*/definition.json")}
    assert {
        "embedding_backward",
        "embedding_rmsnorm_backward",
        "rmsnorm_forward",
        "rmsnorm_backward",
        "cross_entropy",
    } <= names


def test_correct_kernel_passes_with_exit_0_and_json_report() -> None:
    r = _run(
        "audit",
        str(KERNELS / "embedding_backward/solutions/pytorch_fp32"),
        "--stages",
        "static,benchmark,probes",
        "--json",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["verdict"] == "pass"
    statuses = {s["name"]: s["status"] for s in report["stages"]}
    assert statuses == {
        "intake": "passed",
        "static": "passed",
        "benchmark": "passed",
        "probes": "passed",
        "canary": "skipped",
        "verdict": "passed",
    }
    assert all(s["summary"] for s in report["stages"])


def test_bf16_accumulator_passes_benchmark_fails_probes_exit_1() -> None:
    r = _run(
        "audit",
        str(KERNELS / "embedding_backward/solutions/pytorch_bf16_accum/solution.json"),
        "--stages",
        "benchmark,probes",
        "--json",
    )
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads(r.stdout)
    statuses = {s["name"]: s["status"] for s in report["stages"]}
    assert report["verdict"] == "fail" and statuses["benchmark"] == "passed" and statuses["probes"] == "failed"
    assert "accumulat" in report["summary"]


def test_python_file_shorthand_needs_a_definition(tmp_path: Path) -> None:
    src = json.loads((KERNELS / "embedding_backward/solutions/pytorch_fp32/solution.json").read_text())
    f = tmp_path / "mine.py"
    f.write_text(src["sources"][0]["content"])
    r = _run("audit", str(f))
    assert r.returncode == 2 and "--definition" in r.stdout + r.stderr
    r = _run("audit", str(f), "--definition", "embedding_backward", "--stages", "benchmark", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["solution"] == "mine"


def test_bad_input_exits_2_with_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "solution.json"
    bad.write_text(
        json.dumps({"name": "x", "definition": "embedding_backward", "spec": {"languages": ["pytorch"]}, "sources": []})
    )
    r = _run("audit", str(bad))
    assert r.returncode == 2
    assert "spec.entry_point" in r.stdout + r.stderr
    unknown = tmp_path / "u.json"
    unknown.write_text(
        json.dumps(
            {
                **json.loads((KERNELS / "embedding_backward/solutions/pytorch_fp32/solution.json").read_text()),
                "definition": "no_such_op",
            }
        )
    )
    r = _run("audit", str(unknown))
    assert r.returncode == 2 and "unknown definition 'no_such_op'" in r.stdout + r.stderr
    r = _run("audit", str(tmp_path / "missing.json"))
    assert r.returncode == 2 and "file not found" in r.stdout + r.stderr
    r = _run("audit", str(KERNELS / "embedding_backward/solutions/pytorch_fp32"), "--stages", "speed")
    assert r.returncode == 2 and "unknown stage" in r.stdout + r.stderr


def test_problem_dir_audits_a_definition_outside_the_catalogue(tmp_path: Path) -> None:
    """A SOL-ExecBench folder of one's own (no audit.json, no oracle.py): audited by the generic path, exit codes as usual."""
    own = tmp_path / "my_softmax"
    own.mkdir()
    definition = json.loads((KERNELS / "softmax/definition.json").read_text())
    definition["name"] = "my_softmax"
    (own / "definition.json").write_text(json.dumps(definition))
    (own / "workload.jsonl").write_text((KERNELS / "softmax/workload_cpu.jsonl").read_text())
    solution = json.loads((KERNELS / "softmax/solutions/pytorch_fp32/solution.json").read_text())
    solution["definition"] = "my_softmax"
    (tmp_path / "solution.json").write_text(json.dumps(solution))
    r = _run("audit", str(tmp_path / "solution.json"), "--problem-dir", str(own), "--stages", "benchmark", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["definition"] == "my_softmax"
    # a solution naming another definition is audited against the one given (SOL-ExecBench never compares them),
    # and the report says so
    other = _run(
        "audit",
        str(KERNELS / "softmax/solutions/pytorch_fp32"),
        "--problem-dir",
        str(own),
        "--stages",
        "intake",
        "--json",
    )
    assert other.returncode == 0, other.stdout + other.stderr
    report = json.loads(other.stdout)
    assert report["definition"] == "my_softmax"
    (note,) = report["stages"][0]["evidence"]["compat_notes"]
    assert "solution.definition is 'softmax'; audited against the definition 'my_softmax'" in note


def test_a_problem_folder_need_not_be_named_after_its_definition(tmp_path: Path) -> None:
    """tests/fixtures/solexecbench holds the definition vecadd_f32, in SOL-ExecBench's own format."""
    assert FIXTURES.name != json.loads((FIXTURES / "definition.json").read_text())["name"]
    r = _run(
        "audit",
        str(FIXTURES / "solution_pytorch.json"),
        "--problem-dir",
        str(FIXTURES),
        "--stages",
        "benchmark",
        "--json",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["definition"] == "vecadd_f32" and report["verdict"] == "pass"
    assert "compat_notes" not in report["stages"][0]["evidence"]
    # the older spec.language form, and a definition field naming the folder: both read, both noted
    sol = json.loads((FIXTURES / "older_form_solution.json").read_text())
    sol["definition"] = FIXTURES.name
    (tmp_path / "solution.json").write_text(json.dumps(sol))
    r = _run("audit", str(tmp_path / "solution.json"), "--problem-dir", str(FIXTURES), "--stages", "intake", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    intake = json.loads(r.stdout)["stages"][0]
    older, rebound = intake["evidence"]["compat_notes"]
    assert "spec.language 'python'" in older and f"solution.definition is '{FIXTURES.name}'" in rebound
    assert "compat note" in intake["summary"]


def test_definition_flag_picks_the_catalogue_problem_by_name(tmp_path: Path) -> None:
    sol = json.loads((KERNELS / "embedding_backward/solutions/pytorch_fp32/solution.json").read_text())
    sol["definition"] = "embedding_backward_v2"  # what the file calls it; --definition names the catalogue's
    (tmp_path / "solution.json").write_text(json.dumps(sol))
    r = CliRunner().invoke(app, ["audit", str(tmp_path / "solution.json"), "--stages", "intake", "--json"])
    assert r.exit_code == 2 and "unknown definition 'embedding_backward_v2'" in r.stderr
    r = CliRunner().invoke(
        app,
        [
            "audit",
            str(tmp_path / "solution.json"),
            "--definition",
            "embedding_backward",
            "--stages",
            "intake",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["definition"] == "embedding_backward" and report["stages"][0]["status"] == "passed"
    assert "named by --definition" in report["stages"][0]["evidence"]["compat_notes"][0]


@pytest.mark.parametrize("lang", ["cute_dsl", "cutile", "cudnn_frontend", "cuda_cpp", "cutlass", "cublas", "cudnn"])
def test_a_gpu_only_language_on_the_cpu_exits_2_naming_the_device(lang: str) -> None:
    r = CliRunner().invoke(app, ["audit", str(FIXTURES / f"solution_{lang}.json"), "--problem-dir", str(FIXTURES)])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), (r.exception, r.stdout, r.stderr)
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error:") and "run only on an NVIDIA GPU (CUDA)" in line and f"'{lang}'" in line
    assert "this audit's devices are: cpu (--device)" in line and "auditing" not in r.stderr and r.stdout == ""
