"""The canary on an H200: known-bad kernels must fail, correct ones pass, repeated audits measure false positives.

Usage: python benchmarks/gpu_canary.py --out canary_gpu.json [--repeats 12] [--jobs 6] [--budget-s 480]
Runs the canary stage (GPU profile) for every (problem, solution) in CASES, then `--repeats`
more audits of correct kernels, each audit with a fresh secret seed. The summary line reports the
measured false-positive rate over every audit of a correct kernel. With --jobs N, N audits run
at once, each in its own process (the canary's verdict does not depend on timing; the seconds
per audit are then those of a shared GPU). Results are rewritten after every audit, so a run
cut short by --budget-s or a kill keeps what finished.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import secrets
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks.parallel import run_jobs
from worker.canary.profiles import CanaryProfile
from worker.catalogue import Problem, load_catalogue
from worker.context import AuditContext
from worker.stages import canary

# (problem, solution, expected): the known-bad bf16 accumulators, their fp32 counterparts, and every
# other correct example; "any" marks known-bad kernels the canary is not required to catch
CASES: list[tuple[str, str, str]] = [
    ("embedding_backward", "pytorch_bf16_accum", "fail"),
    ("embedding_backward", "triton_bf16_atomic", "fail"),
    ("embedding_rmsnorm_backward", "pytorch_bf16_embed_accum", "fail"),
    ("embedding_rmsnorm_backward", "triton_bf16_embed_atomic", "fail"),
    ("embedding_backward", "pytorch_fp32", "pass"),
    ("embedding_backward", "triton_fp32", "pass"),
    ("embedding_rmsnorm_backward", "pytorch_fp32", "pass"),
    ("embedding_rmsnorm_backward", "triton_fp32", "pass"),
    ("rmsnorm_forward", "pytorch", "pass"),
    ("rmsnorm_forward", "triton", "pass"),
    ("rmsnorm_backward", "pytorch", "pass"),
    ("rmsnorm_backward", "triton", "pass"),
    ("cross_entropy", "pytorch", "pass"),
    ("cross_entropy", "triton", "pass"),
    ("rmsnorm_backward", "triton_bf16_partials", "any"),
    ("rmsnorm_backward", "pytorch_hf_bf16_terms", "any"),
]
# repeated audits of correct kernels (fresh seed each), one per site: the embedding sites first, where training is most
# sensitive, then the norm, the loss and a GEMM's backward (the linear site)
REPEAT_CORRECT: list[tuple[str, str]] = [
    ("embedding_backward", "triton_fp32"),
    ("embedding_rmsnorm_backward", "triton_fp32"),
    ("rmsnorm_backward", "triton"),
    ("cross_entropy", "triton"),
    ("linear_backward", "pytorch_fp32"),
]


def audit_one(problem_name: str, solution_name: str, seed: int, device: str) -> dict[str, Any]:
    return canary_row(load_catalogue().get(problem_name), solution_name, seed, device)


def canary_row(
    problem: Problem, solution_name: str, seed: int, device: str, profile: CanaryProfile | None = None
) -> dict[str, Any]:
    """One canary stage of an example solution, as a row: status, loss gaps and limits, fidelity, timings, curves.
    `profile`: the stage's canary profile (default: the device's)."""
    solution = problem.example_solution(solution_name)
    ctx = AuditContext(problem=problem, solution=solution, device=device, seed=seed)
    t = time.perf_counter()
    try:
        result = canary.run(ctx, profile)
    finally:
        ctx.close()
    m = result.metrics
    return {
        "problem": problem.name,
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
        "site": m.get("site"),
        "site_match": m.get("site_match"),
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


def audit_job(problem: str, sol: str, expected: str, kind: str, device: str) -> dict[str, Any]:
    cat = load_catalogue()
    if problem not in cat or sol not in cat.get(problem).example_solutions():
        return {"problem": problem, "solution": sol, "expected": expected, "kind": kind, "status": "missing"}
    r = audit_one(problem, sol, secrets.randbits(62), device)
    r.update(expected=expected, kind=kind)
    return r


def summarise(rows: list[dict[str, Any]], planned: int, jobs: int, started: float) -> dict[str, Any]:
    ran = [r for r in rows if r["status"] != "missing"]
    correct = [r for r in ran if r["expected"] == "pass"]
    bad = [r for r in ran if r["expected"] == "fail"]
    fp = [r for r in correct if r["status"] != "passed"]
    caught = [r for r in bad if r["status"] == "failed"]
    per_audit = [r["seconds"] for r in ran]
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "planned_audits": planned,
        "finished_audits": len(rows),
        "concurrent_audits": jobs,
        "correct_audits": len(correct),
        "false_positives": len(fp),
        "false_positive_rate": (len(fp) / len(correct)) if correct else None,
        "correct_by_kernel": {
            key: {
                "audits": sum(1 for r in correct if f"{r['problem']}/{r['solution']}" == key),
                "false_positives": sum(1 for r in fp if f"{r['problem']}/{r['solution']}" == key),
                "site": next((r.get("site") for r in correct if f"{r['problem']}/{r['solution']}" == key), None),
            }
            for key in sorted({f"{r['problem']}/{r['solution']}" for r in correct})
        },
        "bad_audits": len(bad),
        "bad_caught": len(caught),
        "seconds_per_audit_mean": round(sum(per_audit) / len(per_audit), 1) if per_audit else None,
        "seconds_per_audit_max": max(per_audit, default=None),
        "total_s": round(time.perf_counter() - started, 1),
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    hdr = f"{'problem/solution':48} {'kind':6} {'exp':4} {'status':7} {'sgd gap':>9} {'sgd lim':>8} {'adam gap':>9} {'adam lim':>8} {'fid x':>7} {'AdamW masks':>11} {'s':>5}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        g, lim = r.get("loss_gap") or {}, r.get("loss_threshold") or {}
        print(
            f"{r['problem'] + '/' + r['solution']:48} {r['kind']:6} {r['expected']:4} {r['status']:7} "
            f"{_fmt(g.get('sgd')):>9} {_fmt(lim.get('sgd')):>8} {_fmt(g.get('adamw')):>9} {_fmt(lim.get('adamw')):>8} "
            f"{_fmt(r.get('fidelity_worst_ratio')):>7} {r.get('masked_by_adamw', '-')!s:>11} {_fmt(r.get('seconds')):>5}"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="canary_gpu.json")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=12, help="repeated audits of correct kernels (fresh seeds)")
    ap.add_argument("--jobs", type=int, default=1, help="audits run at once, each in its own process")
    ap.add_argument("--budget-s", type=float, default=480.0, help="stop waiting for audits after this many seconds")
    ap.add_argument("--only", default="", help="comma-separated solution names to run (default: all)")
    args = ap.parse_args()
    started = time.perf_counter()
    only = {s for s in args.only.split(",") if s}
    cases = [(p, s, e, "case") for p, s, e in CASES if not only or s in only]
    # informational cases last, so a short budget spends itself on the ones with an expectation
    todo = [c for c in cases if c[2] != "any"]
    todo += [(*REPEAT_CORRECT[i % len(REPEAT_CORRECT)], "pass", "repeat") for i in range(args.repeats)]
    todo += [c for c in cases if c[2] == "any"]
    rows: list[dict[str, Any]] = []

    def record(r: dict[str, Any]) -> None:
        rows.append(r)
        if r["status"] == "missing":
            print(
                f"[{time.perf_counter() - started:6.1f}s] {r['problem']}/{r['solution']}: not in the catalogue, skipped",
                flush=True,
            )
        else:
            print(
                f"[{time.perf_counter() - started:6.1f}s] {r['problem']}/{r['solution']} ({r['kind']}): {r['status']} "
                f"in {r['seconds']}s: {r['summary']}",
                flush=True,
            )
        write()

    def write() -> None:
        summary = summarise(rows, len(todo), args.jobs, started)
        Path(args.out).write_text(json.dumps({"summary": summary, "audits": rows}, indent=1, default=str))

    run_jobs(
        audit_job,
        [(p, s, e, k, args.device) for p, s, e, k in todo],
        workers=args.jobs,
        budget_s=args.budget_s,
        on_result=record,
    )
    print()
    print_table(rows)
    print()
    print(json.dumps(summarise(rows, len(todo), args.jobs, started)))
    write()


if __name__ == "__main__":
    main()
