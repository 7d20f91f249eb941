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
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.expectations import expected, runs_on  # noqa: E402
from worker.catalogue import load_catalogue  # noqa: E402
from worker.engine import parse_stages, run_audit  # noqa: E402


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(0)
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--stages", default="intake,static,benchmark,probes")
    ap.add_argument("--problems", default="")
    ap.add_argument("--solutions", default="", help="comma-separated solution names (default: all)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    stages = parse_stages(args.stages)
    cat = load_catalogue()
    wanted = set(filter(None, args.problems.split(",")))
    wanted_sol = set(filter(None, args.solutions.split(",")))
    rows = []
    import torch

    for problem in cat:
        if wanted and problem.name not in wanted:
            continue
        for sname, sol in problem.example_solutions().items():
            if wanted_sol and sname not in wanted_sol:
                continue
            if not runs_on(sol.spec.target_hardware, args.device):
                continue
            t0 = time.perf_counter()
            report = run_audit(problem, sol, device=args.device, stages=stages, seed=int(time.time() * 1e6) % (1 << 62))
            wall = time.perf_counter() - t0
            statuses = {s.name: s.status.value for s in report.stages}
            mismatches = []
            for st in stages:
                want = expected(problem.name, sname, st)
                if want != "any" and statuses.get(st) != want:
                    mismatches.append(f"{st}: {statuses.get(st)} (expected {want})")
            rows.append({
                "problem": problem.name, "solution": sname, "verdict": report.verdict.value,
                "wall_s": round(wall, 2), "statuses": statuses, "matches_expectation": not mismatches,
                "mismatches": mismatches, "summary": report.summary,
                "stages": [s.model_dump(mode="json") for s in report.stages],
            })
            print(f"{problem.name:28s} {sname:28s} {report.verdict.value:5s} {wall:7.1f}s "
                  + " ".join(f"{k}={v}" for k, v in statuses.items() if k in stages)
                  + ("" if not mismatches else "  MISMATCH " + "; ".join(mismatches)), flush=True)
            print(f"    {report.summary[:300]}", flush=True)
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device_name(args.device), "torch": torch.__version__,
        "stages": list(stages), "n": len(rows), "all_match": all(r["matches_expectation"] for r in rows),
    }
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        pass
    print(json.dumps(meta))
    if args.out:
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0 if meta["all_match"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
