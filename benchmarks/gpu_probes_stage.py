"""GPU check of the probes stage (profile gpu). Usage: python benchmarks/gpu_probes_stage.py PROBLEM:SOLUTION ... ; writes $OUT/gpu_probes.json."""

import json
import os
import sys
import time

sys.path.insert(0, os.getcwd())
from worker.catalogue import load_catalogue
from worker.context import AuditContext
from worker.stages import probes

out_dir = os.environ.get("OUT", "/tmp")
cat = load_catalogue()
todo = [a.split(":") for a in sys.argv[1:]]
summary = {}
for prob_name, sol_name in todo:
    prob = cat.get(prob_name)
    sol = prob.example_solution(sol_name)
    ctx = AuditContext(problem=prob, solution=sol, device="cuda", seed=5)
    t = time.time()
    try:
        ctx.sandbox()
        r = probes.run(ctx)
    finally:
        ctx.close()
    dt = time.time() - t
    m = r.metrics
    line = {
        "status": r.status.value,
        "seconds": round(dt, 1),
        "summary": r.summary,
        "worst": {n: p["worst_ratio"] for n, p in m["probes"].items()},
        "checks": {c: (v["passed"], v["summary"]) for c, v in m["checks"].items()},
        "diagnosis": m["diagnosis"][:3],
        "kernel_errors": {
            n: p.get("kernel_error") for n, p in m["probes"].items() if p.get("kernel_error") or p.get("input_error")
        },
    }
    summary[f"{prob_name}:{sol_name}"] = line
    print(f"=== {prob_name}:{sol_name} {r.status.value} {dt:.1f}s :: {r.summary}", flush=True)
    print("   worst", line["worst"], flush=True)
    for c, v in line["checks"].items():
        print("   check", c, v[0], v[1][:200], flush=True)
    for d in line["diagnosis"]:
        print("   diag", d[:400], flush=True)
    if line["kernel_errors"]:
        print("   errors", line["kernel_errors"], flush=True)
    with open(os.path.join(out_dir, "gpu_probes.json"), "w") as f:
        json.dump({**summary}, f, indent=1, default=str)
