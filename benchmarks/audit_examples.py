"""Audit every example solution of the catalogue and compare with what is expected.

  python benchmarks/audit_examples.py --device cuda --stages intake,static,benchmark,probes --out results.json
  python benchmarks/audit_examples.py --device cpu  (CPU-capable examples; Triton under TRITON_INTERPRET=1)

Prints a table (stage statuses, wall time per audit) and whether each matches
benchmarks/expectations.py; exits 1 if any does not.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import secrets
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.expectations import expected, runs_on
from benchmarks.parallel import run_jobs
from worker.catalogue import load_catalogue
from worker.engine import parse_stages, run_audit


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(0)
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def audit_row(
    problem_name: str, sname: str, device: str, stages: tuple[str, ...], pool: Any = None, seed: int | None = None
) -> dict[str, Any]:
    """Audit one example solution and compare each stage with benchmarks/expectations.py (`seed`: the audit's seed,
    a fresh random one by default)."""
    problem = load_catalogue().get(problem_name)
    sol = problem.example_solutions()[sname]
    t0 = time.perf_counter()
    report = run_audit(
        problem, sol, device=device, stages=stages, seed=secrets.randbits(62) if seed is None else seed, pool=pool
    )
    wall = time.perf_counter() - t0
    statuses = {s.name: s.status.value for s in report.stages}
    mismatches = []
    for st in stages:
        want = expected(problem.name, sname, st)
        if want != "any" and statuses.get(st) != want:
            mismatches.append(f"{st}: {statuses.get(st)} (expected {want})")
    return {
        "problem": problem.name,
        "solution": sname,
        "verdict": report.verdict.value,
        "wall_s": round(wall, 2),
        "statuses": statuses,
        "matches_expectation": not mismatches,
        "mismatches": mismatches,
        "summary": report.summary,
        "stages": [s.model_dump(mode="json") for s in report.stages],
    }


def _report(row: dict[str, Any]) -> dict[str, Any]:
    statuses: dict[str, str] = row["statuses"]
    print(
        f"{row['problem']:28s} {row['solution']:28s} {row['verdict']:5s} {row['wall_s']:7.1f}s "
        + " ".join(f"{k}={v}" for k, v in statuses.items())
        + ("" if not row["mismatches"] else "  MISMATCH " + "; ".join(row["mismatches"])),
        flush=True,
    )
    print(f"    {row['summary'][:300]}", flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--stages", default="intake,static,benchmark,probes")
    ap.add_argument("--problems", default="")
    ap.add_argument("--solutions", default="", help="comma-separated solution names (default: all)")
    ap.add_argument("--out", default="")
    ap.add_argument("--jobs", type=int, default=1, help="audits run at once, each in its own process (default 1)")
    ap.add_argument(
        "--budget-s", type=float, default=float("inf"), help="stop waiting for audits after this many seconds"
    )
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    stages = parse_stages(args.stages)
    cat = load_catalogue()
    wanted = set(filter(None, args.problems.split(",")))
    wanted_sol = set(filter(None, args.solutions.split(",")))
    todo = [
        (problem.name, sname)
        for problem in cat
        if not wanted or problem.name in wanted
        for sname, sol in problem.example_solutions().items()
        if (not wanted_sol or sname in wanted_sol) and runs_on(sol.spec, args.device)
    ]
    import torch

    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    order = {key: i for i, key in enumerate(todo)}

    def record(row: dict[str, Any]) -> None:
        rows.append(_report(row))
        rows.sort(key=lambda r: order[(r["problem"], r["solution"])])
        write_results(args, rows, stages, torch.__version__, planned=len(todo))  # partial results survive a kill

    if args.jobs <= 1:
        for problem_name, sname in todo:
            if time.perf_counter() - started > args.budget_s:
                print(
                    f"time budget of {args.budget_s:.0f} s reached; {len(todo) - len(rows)} audits not started",
                    flush=True,
                )
                break
            record(audit_row(problem_name, sname, args.device, stages))
    else:
        # the verdicts do not depend on timing, but kernel times measured while other audits
        # share the GPU are indicative only
        run_jobs(
            audit_row,
            [(p, s, args.device, stages) for p, s in todo],
            workers=args.jobs,
            budget_s=args.budget_s,
            on_result=record,
        )
    meta = write_results(args, rows, stages, torch.__version__, planned=len(todo))
    print(json.dumps(meta))
    return 0 if meta["all_match"] and meta["n"] == len(todo) else 1


def write_results(
    args: argparse.Namespace, rows: list[dict[str, Any]], stages: tuple[str, ...], torch_version: str, *, planned: int
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device_name(args.device),
        "torch": torch_version,
        "stages": list(stages),
        "n": len(rows),
        "planned": planned,
        "concurrent_audits": max(1, args.jobs),
        "all_match": all(r["matches_expectation"] for r in rows),
    }
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        pass
    if args.out:
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return meta


if __name__ == "__main__":
    raise SystemExit(main())
