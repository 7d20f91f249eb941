"""What the canary costs per audit, on each profile.

Usage: python benchmarks/canary_cost.py [--device cpu|cuda] [--solution pytorch_fp32] [--audits 2] [--out FILE]
Runs the canary stage for one correct example solution and reports wall time per audit,
its breakdown (reference, submission, null runs, fidelity) and the number of training runs.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from worker.canary.profiles import profile_for
from worker.catalogue import load_catalogue
from worker.context import AuditContext
from worker.stages import canary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--problem", default="embedding_backward")
    ap.add_argument("--solution", default="pytorch_fp32")
    ap.add_argument("--audits", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    problem = load_catalogue().get(args.problem)
    solution = problem.example_solution(args.solution)
    profile = profile_for("gpu" if args.device.startswith("cuda") else "cpu")
    rows: list[dict[str, Any]] = []
    for i in range(args.audits):
        ctx = AuditContext(problem=problem, solution=solution, device=args.device, seed=1000 + i)
        t = time.perf_counter()
        ctx.sandbox()  # process start + import: part of the audit, not of the canary
        start_s = time.perf_counter() - t
        try:
            result = canary.run(ctx)
        finally:
            ctx.close()
        m = result.metrics
        rows.append({"audit": i, "status": result.status.value, "sandbox_start_s": round(start_s, 2), **m["timings"],
                     "runs": m["runs"]})
        print(json.dumps(rows[-1]), flush=True)
    runs = rows[0]["runs"]
    n_runs = runs["parent"] + runs["submission"]
    mean_total = sum(r["total_s"] for r in rows) / len(rows)
    summary = {
        "profile": profile.name,
        "device": args.device,
        "torch_threads": profile.threads or torch.get_num_threads(),
        "model": f"{profile.n_layers} layers, d={profile.d_model}, vocab {profile.vocab_size}, batch {profile.batch_size}x{profile.seq_len}, {profile.steps} steps",
        "training_runs_per_audit": n_runs,
        "seconds_per_audit": round(mean_total, 2),
        "seconds_per_parent_run": round(sum(r["reference_sgd_s"] + r.get("reference_adamw_s", 0.0) for r in rows) / len(rows) / len(profile.optimizers), 2),
        "audits": rows,
    }
    print(f"canary cost, {profile.name} profile on {args.device}: {summary['seconds_per_audit']} s per audit "
          f"({n_runs} training runs of {profile.steps} steps: {runs['parent']} here (reference and nulls, ~{summary['seconds_per_parent_run']} s each) "
          f"while the submission's {runs['submission']} run in its own process; plus held-out evaluation and the fidelity check)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
