"""The benchmark scripts that produce the recorded results: parallel audits, time budget, partial output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.proc_support import sandbox_children_under

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, out: Path, tmp: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    tmp.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "benchmarks/audit_examples.py", "--device", "cpu", *args, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        # sandboxes make their folders under TMPDIR: that tells this run's children from any other's
        env={**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1", "TMPDIR": str(tmp)},
    )


def test_parallel_audits_match_expectations_and_keep_input_order(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    done = _run(
        "--problems",
        "embedding_backward",
        "--solutions",
        "pytorch_bf16_accum,pytorch_fp32",
        "--stages",
        "intake,static,benchmark",
        "--jobs",
        "2",
        out=out,
        tmp=tmp_path / "tmp",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["meta"]["concurrent_audits"] == 2 and result["meta"]["n"] == result["meta"]["planned"] == 2
    # the catalogue's order, whichever audit finished first
    assert [r["solution"] for r in result["rows"]] == ["pytorch_bf16_accum", "pytorch_fp32"]
    # the bf16 accumulator passes the benchmark: that is the story
    assert all(r["statuses"]["benchmark"] == "passed" and r["matches_expectation"] for r in result["rows"])


def test_time_budget_stops_running_audits_and_their_sandboxes(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    done = _run(
        "--problems",
        "embedding_backward",
        "--solutions",
        "pytorch_fp32,pytorch_bf16_accum",
        "--jobs",
        "2",
        "--budget-s",
        "4",
        out=out,
        tmp=tmp_path / "tmp",
    )
    assert done.returncode == 1, "an unfinished run must not report success"
    assert "time budget of 4 s reached" in done.stdout
    meta = json.loads(out.read_text())["meta"]
    assert meta["planned"] == 2 and meta["n"] < 2
    assert sandbox_children_under(tmp_path / "tmp") == [], "a stopped audit left its sandbox child running"
