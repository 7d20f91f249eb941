"""An audit the catalogue run never gets back still says where it had got to (benchmarks.audit_progress)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.audit_progress import ProgressLog, summary
from worker.catalogue import load_catalogue
from worker.engine import run_audit

ROOT = Path(__file__).resolve().parents[2]


def test_a_real_audits_progress_reads_back_stage_by_stage(tmp_path: Path) -> None:
    problem = load_catalogue().get("rmsnorm_forward")
    log = ProgressLog(tmp_path / "p.jsonl")
    report = run_audit(
        problem,
        problem.example_solution("pytorch"),
        stages=("intake", "static", "benchmark"),
        seed=11,
        progress=log.note,
        on_stage=log.stage,
    )
    got = summary(tmp_path / "p.jsonl")
    # every stage the report holds, the verdict last, in the order they ran
    assert [(s.stage, s.status) for s in got.finished] == [(s.name, s.status.value) for s in report.stages]
    assert got.finished[-1].stage == "verdict"
    assert got.finished[0].stage == "intake" and all(s.duration_s >= 0 for s in got.finished)
    assert got.last_note is not None and got.last_note.startswith("benchmark")
    assert "intake passed" in got.describe()


def test_a_file_cut_mid_line_or_missing_reads_as_far_as_it_goes(tmp_path: Path) -> None:
    assert summary(tmp_path / "never.jsonl").describe() == "no stage finished"
    path = tmp_path / "cut.jsonl"
    path.write_text(
        json.dumps({"t": 1.0, "stage": "intake", "status": "passed", "duration_s": 0.9})
        + "\n"
        + json.dumps({"t": 2.5, "note": "probes: scale_0.01:x"})
        + '\n{"t": 3.1, "no'
    )
    got = summary(path)
    assert [s.stage for s in got.finished] == ["intake"]
    assert got.last_note == "probes: scale_0.01:x" and got.last_note_at_s == 2.5
    assert got.describe() == "intake passed in 0.9 s; last: 'probes: scale_0.01:x' at 2.5 s"


def test_the_catalogue_run_lists_every_audit_its_budget_cut(tmp_path: Path) -> None:
    out = tmp_path / "cat.md"
    # an earlier run's file for the same audit (a resumed --out): not this run's progress
    stale = tmp_path / "cat.progress" / "rmsnorm_forward__pytorch__generic.jsonl"
    stale.parent.mkdir()
    stale.write_text(json.dumps({"t": 9.0, "stage": "intake", "status": "passed", "duration_s": 8.0}) + "\n")
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/generic_catalogue.py",
            "--with-curated",
            "--only",
            "rmsnorm_forward",
            "--budget-s",
            "0",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1", "TMPDIR": str(tmp_path)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["rows"] == []
    cut = {(u["definition"], u["example"]) for u in record["unfinished"]}
    assert cut == {("rmsnorm_forward", "pytorch"), ("rmsnorm_forward", "triton")}
    assert all(u["why"] in ("stopped by the run's time budget", "never started") for u in record["unfinished"])
    assert "## Unfinished audits" in out.read_text()
    assert not any("intake passed" in u["progress"] for u in record["unfinished"]), "an earlier run's file was read"
