"""The canary on an H200: known-bad kernels must fail, correct ones pass, repeated audits measure false positives.

Usage: python benchmarks/gpu_canary.py --out canary_gpu.json [--repeats 8] [--budget-s 420]
The 4 correct cases plus the repeats give 12 audits of correct kernels, each with a fresh secret seed;
the summary line reports the measured false-positive rate over all of them.
Runs the canary stage (GPU profile) per (problem, solution); prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import secrets
import time
from typing import Any

from worker.catalogue import load_catalogue
from worker.context import AuditContext
from worker.stages import canary

# (problem, solution, expected): the known-bad bf16 accumulators and their fp32 counterparts
CASES: list[tuple[str, str, str]] = [
    ("embedding_backward", "pytorch_bf16_accum", "fail"),
    ("embedding_backward", "triton_bf16_atomic", "fail"),
    ("embedding_rmsnorm_backward", "pytorch_bf16_embed_accum", "fail"),
    ("embedding_rmsnorm_backward", "triton_bf16_embed_atomic", "fail"),
    ("embedding_backward", "pytorch_fp32", "pass"),
    ("embedding_backward", "triton_fp32", "pass"),
    ("embedding_rmsnorm_backward", "pytorch_fp32", "pass"),
    ("embedding_rmsnorm_backward", "triton_fp32", "pass"),
]
REPEAT_CORRECT: list[tuple[str, str]] = [
    ("embedding_backward", "triton_fp32"),
    ("embedding_backward", "pytorch_fp32"),
    ("embedding_rmsnorm_backward", "triton_fp32"),
]


def audit_one(problem_name: str, solution_name: str, seed: int, device: str) -> dict[str, Any]:
    cat = load_catalogue()
    problem = cat.get(problem_name)
    solution = problem.example_solution(solution_name)
    ctx = AuditContext(problem=problem, solution=solution, device=device, seed=seed)
    t = time.perf_counter()
    try:
        result = canary.run(ctx)
    finally:
        ctx.close()
    m = result.metrics
    return {
        "problem": problem_name,
        "solution": solution_name,
        "seed": seed,
        "status": result.status.value,
        "summary": result.summary,
        "seconds": round(time.perf_counter() - t, 1),
        "loss_gap": m.get("loss_gap"),
        "loss_threshold": m.get("loss_threshold"),
        "noise_band": m.get("noise_band"),
        "loss_exceeded": m.get("loss_exceeded"),
        "fidelity_worst_ratio": m.get("fidelity_worst_ratio"),
        "fidelity_failed": m.get("fidelity_failed"),
        "masked_by_adamw": m.get("masked_by_adamw"),
        "timings": m.get("timings"),
        "fidelity": result.evidence.get("fidelity"),
        "curves_heldout": {k: v["heldout"] for k, v in result.evidence.get("curves", {}).items()},
    }


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return "inf" if math.isinf(x) else f"{x:+.4f}" if abs(x) < 10 else f"{x:.1f}"
    return str(x)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="canary_gpu.json")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=8, help="repeated audits of correct kernels (fresh seeds)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting new audits after this many seconds")
    ap.add_argument("--only", default="", help="comma-separated solution names to run (default: all)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    cat = load_catalogue()
    rows: list[dict[str, Any]] = []
    only = {s for s in args.only.split(",") if s}

    def run(problem: str, sol: str, expected: str, kind: str) -> None:
        if problem not in cat or sol not in cat.get(problem).example_solutions():
            rows.append({"problem": problem, "solution": sol, "expected": expected, "kind": kind, "status": "missing"})
            print(f"[{time.perf_counter() - t0:6.1f}s] {problem}/{sol}: not in the catalogue, skipped", flush=True)
            return
        r = audit_one(problem, sol, secrets.randbits(62), args.device)
        r.update(expected=expected, kind=kind)
        rows.append(r)
        print(f"[{time.perf_counter() - t0:6.1f}s] {problem}/{sol} ({kind}): {r['status']} in {r['seconds']}s: {r['summary']}", flush=True)

    for problem, sol, expected in CASES:
        if only and sol not in only:
            continue
        if time.perf_counter() - t0 > args.budget_s:
            break
        run(problem, sol, expected, "case")
    for i in range(args.repeats):
        if time.perf_counter() - t0 > args.budget_s:
            print(f"time budget reached after {i} repeated audits", flush=True)
            break
        problem, sol = REPEAT_CORRECT[i % len(REPEAT_CORRECT)]
        run(problem, sol, "pass", "repeat")

    ran = [r for r in rows if r["status"] != "missing"]
    correct = [r for r in ran if r["expected"] == "pass"]
    bad = [r for r in ran if r["expected"] == "fail"]
    fp = [r for r in correct if r["status"] == "failed"]
    caught = [r for r in bad if r["status"] == "failed"]
    per_audit = [r["seconds"] for r in ran]
    summary = {
        "correct_audits": len(correct),
        "false_positives": len(fp),
        "false_positive_rate": (len(fp) / len(correct)) if correct else None,
        "bad_audits": len(bad),
        "bad_caught": len(caught),
        "seconds_per_audit_mean": (sum(per_audit) / len(per_audit)) if per_audit else None,
        "seconds_per_audit_max": max(per_audit, default=None),
        "total_s": round(time.perf_counter() - t0, 1),
    }
    print()
    hdr = f"{'problem/solution':48} {'kind':6} {'exp':4} {'status':7} {'sgd gap':>9} {'sgd lim':>8} {'adam gap':>9} {'adam lim':>8} {'fid x':>7} {'AdamW masks':>11} {'s':>5}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        g, lim = r.get("loss_gap") or {}, r.get("loss_threshold") or {}
        print(f"{r['problem'] + '/' + r['solution']:48} {r['kind']:6} {r['expected']:4} {r['status']:7} "
              f"{_fmt(g.get('sgd')):>9} {_fmt(lim.get('sgd')):>8} {_fmt(g.get('adamw')):>9} {_fmt(lim.get('adamw')):>8} "
              f"{_fmt(r.get('fidelity_worst_ratio')):>7} {str(r.get('masked_by_adamw', '-')):>11} {_fmt(r.get('seconds')):>5}")
    print()
    print(json.dumps(summary))
    with open(args.out, "w") as f:
        json.dump({"summary": summary, "audits": rows}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
