"""Audit every problem folder without audit.json through the generic path, and tabulate what it catches.

  python benchmarks/generic_catalogue.py --out benchmarks/results/generic_catalogue_cpu.md
  python benchmarks/generic_catalogue.py --with-curated --jobs 2 --out generic.md   # curated ones too, judged generically

Stages intake, static, benchmark, probes on the CPU (or --device cuda). Curated problems (--with-curated)
are audited as if their folder had no audit.json and no oracle.py, so the table says what the generic
path alone catches. Writes a markdown table to --out and the same rows as JSON beside it (.json).
An example is known-bad when benchmarks/expectations.py lists it or its description starts "Known-bad".
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import secrets
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.audit_examples import device_name  # noqa: E402
from benchmarks.expectations import KNOWN_BAD, runs_on  # noqa: E402
from benchmarks.parallel import run_jobs  # noqa: E402
from worker.catalogue import load_catalogue  # noqa: E402
from worker.engine import run_audit  # noqa: E402

STAGES = ("intake", "static", "benchmark", "probes")


def known_bad(problem: str, solution: str, description: str) -> bool:
    return (problem, solution) in KNOWN_BAD or description.strip().lower().startswith("known-bad")


def caught_by(probes: dict[str, Any]) -> list[str]:
    """Failed probes and checks of the probes stage (what caught the kernel)."""
    metrics = probes.get("metrics", {})
    failed = [n for n, m in metrics.get("probes", {}).items() if m.get("passed") is False]
    failed += [f"check:{n}" for n, c in metrics.get("checks", {}).items() if not c.get("passed")]
    return failed


def audit_row(problem_name: str, sname: str, device: str, uncurate: bool) -> dict[str, Any]:
    problem = load_catalogue().get(problem_name)
    if uncurate:
        problem = problem.as_uncurated()
    sol = problem.example_solution(sname)
    t0 = time.perf_counter()
    report = run_audit(problem, sol, device=device, stages=STAGES, seed=secrets.randbits(62))
    stages = {s.name: s for s in report.stages}
    probes = stages["probes"].model_dump(mode="json")
    bench = stages["benchmark"]
    return {
        "definition": problem_name,
        "example": sname,
        "curated_folder": uncurate,
        "known_bad": known_bad(problem_name, sname, sol.description or ""),
        "description": sol.description,
        "benchmark": bench.status.value,
        "benchmark_summary": bench.summary,
        "generic_probes": probes["status"],
        "probes_summary": probes["summary"],
        "caught_by": caught_by(probes),
        "worst_ratio": probes.get("metrics", {}).get("worst_ratio"),
        "oracle": probes.get("evidence", {}).get("oracle"),
        "not_applied": probes.get("evidence", {}).get("generic", {}).get("not_applied"),
        "not_applicable": probes.get("evidence", {}).get("not_applicable"),
        "seed_note": "probe axes and seeds in the probes stage evidence",
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def verdict_cell(row: dict[str, Any]) -> str:
    if not row["known_bad"]:
        ok = row["benchmark"] == "passed" and row["generic_probes"] == "passed"
        return "correct example: passes" if ok else "correct example: FLAGGED (false positive)"
    if row["benchmark"] == "failed":
        return "known-bad: caught by the benchmark rule" + (" and the generic probes" if row["generic_probes"] == "failed" else "")
    if row["generic_probes"] == "failed":
        return "known-bad: caught only by the generic probes"
    return "known-bad: MISSED by both"


def markdown(rows: list[dict[str, Any]], header: str) -> str:
    lines = [header, "", "| definition | example | benchmark | generic probes | caught by | worst ratio | outcome | time |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        caught = ", ".join(r["caught_by"][:4]) + ("..." if len(r["caught_by"]) > 4 else "")
        ratio = f"{r['worst_ratio']:.3g}x" if r["worst_ratio"] is not None else (
            "non-finite" if "infx" in r["probes_summary"] else "")
        lines.append(f"| {r['definition']} | {r['example']} | {r['benchmark']} | {r['generic_probes']} | {caught or '-'} | "
                     f"{ratio} | {verdict_cell(r)} | {r['wall_s']} s |")
    lines += ["", "Probe summaries:", ""]
    for r in rows:
        lines.append(f"- **{r['definition']}/{r['example']}**: benchmark: {r['benchmark_summary']} | probes: {r['probes_summary']}")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--with-curated", action="store_true", help="also audit curated problems, judged generically")
    ap.add_argument("--only", default=None, help="comma-separated definitions")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--budget-s", type=float, default=float("inf"))
    ap.add_argument("--out", type=Path, required=True, help="markdown file; the JSON rows go beside it")
    ap.add_argument("--resume", action="store_true", help="keep the rows already in --out's JSON and audit only the rest")
    args = ap.parse_args()
    catalogue = load_catalogue()
    only = set(args.only.split(",")) if args.only else None
    jobs = []
    for problem in catalogue:
        if only is not None and problem.name not in only:
            continue
        if problem.curated and not args.with_curated:
            continue
        for sname, sol in sorted(problem.example_solutions().items()):
            if runs_on(sol.spec, args.device):
                jobs.append((problem.name, sname, args.device, problem.curated))
    rows: list[dict[str, Any]] = []
    previous = json.loads(args.out.with_suffix(".json").read_text()) if args.resume and args.out.with_suffix(".json").exists() else None
    if previous is not None:
        rows = previous["rows"]
        done = {(r["definition"], r["example"]) for r in rows}
        jobs = [j for j in jobs if (j[0], j[1]) not in done]
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    import torch

    header = previous["header"] if previous is not None else (f"# Generic path over the catalogue ({args.device}: {device_name(args.device)}, torch {torch.__version__}, "
              f"{started})\n\nStages {','.join(STAGES)}; problems without audit.json"
              + (" and, judged as if uncurated, the curated ones" if args.with_curated else "") + ".")

    def write() -> None:
        rows.sort(key=lambda r: (r["definition"], r["example"]))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(markdown(rows, header))
        args.out.with_suffix(".json").write_text(json.dumps({"header": header, "rows": rows}, indent=1))

    def record(row: dict[str, Any]) -> None:
        rows.append(row)
        print(f"{row['definition']}/{row['example']}: benchmark {row['benchmark']}, probes {row['generic_probes']} "
              f"({row['wall_s']} s) -> {verdict_cell(row)}", flush=True)
        write()

    unfinished = run_jobs(audit_row, jobs, workers=args.jobs, budget_s=args.budget_s, on_result=record)
    write()
    missed = [r for r in rows if r["known_bad"] and r["benchmark"] != "failed" and r["generic_probes"] != "failed"]
    false_pos = [r for r in rows if not r["known_bad"] and (r["benchmark"] != "passed" or r["generic_probes"] != "passed")]
    print(f"{len(rows)} audits; {len(missed)} known-bad missed; {len(false_pos)} correct examples flagged; {unfinished} unfinished")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
