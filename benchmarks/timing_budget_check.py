"""The benchmark stage's timing budget on a GPU: a correct embedding-backward kernel made slow by a host sleep in
every call, timed with a small budget, and the same kernel without the sleep (the full plan).

  python benchmarks/timing_budget_check.py --sleep-s 0.3 --budget-s 2 --out timing_budget.json

Prints and writes, for each: the stage's status, the quickest correctness round (the estimate the plan is sized
from), the timed calls and warm-up calls, whether the plan was trimmed and a second pass skipped, the window's wall
time, and the stage summary's timing sentence (worker.stages.benchmark.timed.plan_blocks).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from worker.catalogue import load_catalogue
from worker.engine import run_audit
from worker.formats import Solution, SolutionSpec, SourceFile

BODY = """import time
import torch


def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    if {sleep_s} > 0:
        time.sleep({sleep_s})
    acc = torch.zeros(grad_weight.shape, dtype=torch.float32, device=grad_weight.device)
    acc.index_add_(0, indices, grad_output.float())
    if padding_idx >= 0:
        acc[padding_idx] = 0
    grad_weight.copy_(acc)
"""


def audit(sleep_s: float, budget_s: float, device: str) -> dict[str, Any]:
    problem = load_catalogue().get("embedding_backward")
    solution = Solution(
        name=f"sleep_{sleep_s:g}",
        definition=problem.name,
        spec=SolutionSpec(language="python", entry_point="kernel.py::run", destination_passing_style=True),
        sources=[SourceFile(path="kernel.py", content=BODY.format(sleep_s=sleep_s))],
    )
    os.environ["KAUDIT_TIMING_BUDGET_S"] = str(budget_s)
    t0 = time.perf_counter()
    report = run_audit(problem, solution, stages=["intake", "benchmark"], seed=11, device=device)
    wall = time.perf_counter() - t0
    bench = next(s for s in report.stages if s.name == "benchmark")
    timing = bench.metrics.get("timing", {})
    keep = ("est_call_ms", "reps", "warmup", "blocks", "budget_trimmed", "retime_skipped", "retimed", "request_wall_ms")
    return {
        "sleep_s": sleep_s,
        "budget_s": budget_s,
        "status": bench.status.value,
        "audit_wall_s": round(wall, 1),
        **{k: timing.get(k) for k in keep},
        "kernel_median_ms": timing.get("kernel_median_ms"),
        "summary": bench.summary,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sleep-s", type=float, default=0.3)
    ap.add_argument("--budget-s", type=float, default=2.0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    rows = []
    for sleep_s in (args.sleep_s, 0.0):
        rows.append(audit(sleep_s, args.budget_s, args.device))
        print(json.dumps(rows[-1]), flush=True)
    name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    record = {
        "device": name,
        "torch": torch.__version__,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(sys.argv),
        "rows": rows,
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
