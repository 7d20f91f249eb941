"""What the measurement scripts write from their rows: the generic catalogue's canary column, the matrix plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.canary_matrix_plot import worst_by_bucket
from benchmarks.generic_catalogue import (
    breadth_first,
    canary_cell,
    markdown,
    plan_jobs,
    verdict_cell,
    worth_redoing,
)
from worker.catalogue import load_catalogue

ROOT = Path(__file__).resolve().parents[2]


def _row(**extra: object) -> dict[str, object]:
    return {
        "definition": "linear_backward",
        "example": "pytorch_fp32",
        "known_bad": False,
        "benchmark": "passed",
        "generic_probes": "passed",
        "caught_by": [],
        "worst_ratio": 1.0,
        "probes_summary": "p",
        "benchmark_summary": "b",
        "wall_s": 3.0,
        **extra,
    }


def test_the_canary_column_shows_status_site_fidelity_and_time_and_appears_only_when_run() -> None:
    ran = _row(canary={"status": "failed", "site": "linear", "fidelity_worst_ratio": 11.34, "seconds": 4.25})
    skipped = _row(example="pytorch_other", canary={"status": "skipped", "site": None})
    assert canary_cell(ran) == "failed (linear, 11.3x, 4.2 s)"
    assert canary_cell(skipped) == "skipped"
    with_canary = markdown([ran, skipped], "# t")
    assert "canary (site, fidelity x ideal)" in with_canary and "failed (linear, 11.3x, 4.2 s)" in with_canary
    without = markdown([_row()], "# t")
    assert "canary (site" not in without
    # every table row has as many cells as its header
    for text in (with_canary, without):
        table = [ln for ln in text.splitlines() if ln.startswith("|")]
        assert len({ln.count("|") for ln in table}) == 1


def test_the_matrix_plot_reads_the_worst_ratio_per_contribution_bucket_and_drops_exact_buckets() -> None:
    row = {
        "fidelity": [
            {"step": 0, "bucket": "1", "ratio": 0.0},
            {"step": 0, "bucket": "512-4095", "ratio": 12.0},
            {"step": 50, "bucket": "512-4095", "ratio": 22.9},
            {"step": 50, "bucket": "8-63", "ratio": 3.7},
            {"step": 0, "bucket": "0", "ratio": 0.0},
        ]
    }
    assert worst_by_bucket(row) == {512: 22.9, 8: 3.7}


def test_the_recorded_h200_matrix_shows_real_text_revealing_what_uniform_ids_mask() -> None:
    """The README's claim, read off the committed rows: every bf16 run fails on real text and passes on uniform ids."""
    rows = json.loads((ROOT / "benchmarks/results/h200-2026-12-04/canary_matrix_h200.json").read_text())["rows"]
    bf16 = [r for r in rows if "bf16" in r["kernel"]]
    assert {r["text"] for r in bf16} == {"real", "uniform"}
    for r in bf16:
        assert r["status"] == ("failed" if r["text"] == "real" else "passed"), r["kernel"]
    for r in rows:
        if "fp32" in r["kernel"]:
            assert r["status"] == "passed"


@pytest.mark.parametrize("bucket", ["", "none", "0"])
def test_buckets_without_contributions_are_not_plotted(bucket: str) -> None:
    assert worst_by_bucket({"fidelity": [{"bucket": bucket, "ratio": 5.0}]}) == {}


def test_breadth_first_audits_one_example_of_every_definition_before_any_second() -> None:
    jobs = plan_jobs(load_catalogue(), "cpu", ("generic",), None, with_curated=True)
    ordered = breadth_first(jobs)
    assert sorted(ordered) == sorted(jobs)
    definitions = {j[0] for j in jobs}
    assert {j[0] for j in ordered[: len(definitions)]} == definitions  # the first pass spans the catalogue
    assert len(definitions) < len(jobs)  # and some definition has a second example, which comes after
    for name in definitions:  # each definition's examples keep their order
        assert [j for j in ordered if j[0] == name] == [j for j in jobs if j[0] == name]


def test_a_stage_error_is_inconclusive_in_the_table_never_a_false_positive_or_a_miss() -> None:
    # an audit's budget or the card's memory running out says nothing about the kernel
    assert verdict_cell(_row(generic_probes="error")) == "correct example: inconclusive (a stage error)"
    assert verdict_cell(_row(known_bad=True, generic_probes="error")) == "known-bad: inconclusive (a stage error)"
    # a failure still decides, whatever else errored
    assert verdict_cell(_row(benchmark="failed", generic_probes="error")) == "correct example: FLAGGED (false positive)"
    assert verdict_cell(_row(known_bad=True, benchmark="error", generic_probes="failed")).startswith(
        "known-bad: caught"
    )
    assert verdict_cell(_row(known_bad=True)) == "known-bad: MISSED by both"


def test_a_resumed_run_redoes_the_rows_without_a_verdict_and_keeps_every_verdict() -> None:
    budget_cut = {"status": "skipped", "summary": "not run: the audit's budget ran out (inconclusive, not counted)"}
    assert worth_redoing(_row(benchmark="error", generic_probes="error", canary=budget_cut))
    assert worth_redoing(_row(canary={"status": "error", "summary": "expected mat1 and mat2 to have the same dtype"}))
    assert worth_redoing(_row(known_bad=True, generic_probes="error"))
    # a verdict with a canary cut for time: the verdict stands, the canary is still to come
    assert worth_redoing(_row(known_bad=True, generic_probes="failed", canary=budget_cut))
    # verdicts stay, either way, and so does a canary that had no site to run at
    assert not worth_redoing(_row(canary={"status": "passed", "summary": "trains like the reference"}))
    assert not worth_redoing(_row(benchmark="failed", canary={"status": "failed", "summary": "changes training"}))
    assert not worth_redoing(_row(canary={"status": "skipped", "summary": "no canary for this op: it fits no site"}))
