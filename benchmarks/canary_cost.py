"""What the canary costs per audit, on each profile.

Usage: python benchmarks/canary_cost.py [--device cpu|cuda] [--solution pytorch_fp32] [--audits 2] [--out FILE]
       [--no-cache] [--eager-nulls] [--as-worker]
(--no-cache: a fresh canary seed per audit, so the parent always trains; --eager-nulls: the null runs trained with
the reference every time, as before the CPU profile's lazy_nulls; --as-worker: each audit's sandbox child taken from
a spare started and warmed ahead, and the parent's first training done before the first audit, as a long-lived
Celery worker has them (app/jobs/resources.py); without it every child is cold, a worker's first audit)
Runs the canary stage for one example solution and reports wall time per audit, its breakdown
(per optimiser: the parent's stacked reference and null runs with their held-out evaluation, the
submission's run in its process; held-out evaluation of the submission's weights; gradient fidelity),
the number of training runs, and the machine's load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from typing import Any

import torch

from worker.canary.parent_warm import warm_parent
from worker.canary.profiles import profile_for
from worker.catalogue import load_catalogue
from worker.context import AuditContext
from worker.sandbox.pool import SandboxPool
from worker.stages import canary


def _cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) of this process and of its reaped children (the sandbox child).
    Unlike wall time, they do not grow when other work shares the machine."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"parent": me.ru_utime + me.ru_stime, "children": kids.ru_utime + kids.ru_stime}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--problem", default="embedding_backward")
    ap.add_argument("--solution", default="pytorch_fp32")
    ap.add_argument("--audits", type=int, default=2)
    ap.add_argument("--out", default="")
    ap.add_argument("--no-cache", action="store_true", help="a fresh canary seed per audit (no parent cache)")
    ap.add_argument("--eager-nulls", action="store_true", help="train the nulls with the reference every time")
    ap.add_argument(
        "--as-worker",
        action="store_true",
        help="warmed spare sandbox children and a warmed parent, as a long-lived audit worker has them",
    )
    args = ap.parse_args()
    problem = load_catalogue().get(args.problem)
    solution = problem.example_solution(args.solution)
    overrides: dict[str, Any] = {}
    if args.no_cache:
        overrides["seed_pool"] = None
    if args.eager_nulls:
        overrides["lazy_nulls"] = False
    profile = profile_for("gpu" if args.device.startswith("cuda") else "cpu", **overrides)
    pool = SandboxPool(args.device, warm=True) if args.as_worker else None
    warm: dict[str, Any] = {}
    if pool is not None:
        pool.prestart()
        if args.device.startswith("cuda"):
            warm["parent_warm_s"] = warm_parent(torch.device(args.device), load_catalogue())
    rows: list[dict[str, Any]] = []
    load_before = [round(x, 2) for x in os.getloadavg()]
    for i in range(args.audits):
        ctx = AuditContext(problem=problem, solution=solution, device=args.device, seed=1000 + i, pool=pool)
        if pool is not None:
            pool.wait_ready()  # a worker's next audit finds the spare its previous one asked for ready
        t = time.perf_counter()
        ctx.sandbox()  # process start + import: part of the audit, not of the canary
        start_s = time.perf_counter() - t
        before = _cpu_seconds()
        try:
            result = canary.run(ctx, profile)
        finally:
            ctx.close()  # reaps the sandbox child, so its CPU time is counted below
        after = _cpu_seconds()
        m = result.metrics
        rows.append(
            {
                "audit": i,
                "status": result.status.value,
                "sandbox_start_s": round(start_s, 2),
                **m["timings"],
                "cpu_s": {k: round(after[k] - before[k], 1) for k in after},
                "runs": m["runs"],
                "loss_gap": m.get("loss_gap"),
                "noise_band": m.get("noise_band"),
                "fidelity_worst_ratio": m.get("fidelity_worst_ratio"),
                "null_mean_gaps": {
                    o: [round(g, 5) for g in c["heldout"]["null_mean_gaps"]]
                    for o, c in result.evidence.get("curves", {}).items()
                },
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    runs = rows[0]["runs"]
    n_runs = runs["parent"] + runs["submission"]
    mean_total = sum(r["total_s"] for r in rows) / len(rows)
    summary = {
        "profile": profile.name,
        "device": args.device,
        "as_worker": args.as_worker,
        **({"child_warm_s": pool.last_warm_s, "handed_warm": pool.handed_warm, **warm} if pool is not None else {}),
        "torch_threads": profile.threads or torch.get_num_threads(),
        "model": f"{profile.n_layers} layers, d={profile.d_model}, vocab {profile.vocab_size}, batch {profile.batch_size}x{profile.seq_len}, {profile.steps} steps",
        "training_runs_per_audit": n_runs,
        "seconds_per_audit": round(mean_total, 2),
        "parent_train_s": round(sum(r.get("parent_train_s", 0.0) for r in rows) / len(rows), 2),
        "submission_train_s": round(sum(r.get("submission_train_s", 0.0) for r in rows) / len(rows), 2),
        "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "audits": rows,
    }
    print(
        f"canary cost, {profile.name} profile on {args.device}: {summary['seconds_per_audit']} s per audit "
        f"({n_runs} training runs of {profile.steps} steps: {runs['parent']} here, stacked in one pass "
        f"({summary['parent_train_s']} s), while the submission's {runs['submission']} train stacked in its own process "
        f"({summary['submission_train_s']} s); then the held-out evaluation and the fidelity check); "
        f"load average before {load_before}, after {summary['load_after']}"
    )
    if pool is not None:
        pool.close()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
