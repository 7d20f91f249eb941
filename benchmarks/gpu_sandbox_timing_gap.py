"""Why does a launch-bound kernel time slower in the sandbox than in the parent? (H200 diagnosis)

benchmarks/gpu_timing_vs_do_bench.py found `rmsnorm_backward/triton_bf16_partials` (one Triton
launch, then a host loop of ~512 small PyTorch ops) at +53% in the sandbox against do_bench,
while the parent's own timing of the same call agreed with do_bench. This script separates the
candidate causes, for that kernel and for `rmsnorm_backward/triton` (one launch, the control):

  order      sandbox and parent timings alternate for --rounds rounds, so a warm-up or clock
             ramp shows up as a trend, not as a sandbox effect
  host time  every timing also records the host's wall time to issue each call; a call is
             launch-bound when that is most of its device time
  env        the sandbox is started twice per round: with its scrubbed environment and with
             the parent's full environment (which variables the scrub drops is printed, by name)
  process    the first sandbox timing runs before the parent has a CUDA context, the later
             ones while the parent holds an idle one

Usage (CUDA machine): python benchmarks/gpu_sandbox_timing_gap.py --out gap.json [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks.gpu_timing_vs_do_bench import (
    do_bench_median,
    import_solution,
)
from worker.catalogue import load_catalogue
from worker.inputs import build_case
from worker.numerics.dtypes import to_torch
from worker.numerics.timing import GPU_TIMING, TimingSample, time_trusted
from worker.reference import Reference
from worker.sandbox import Sandbox, runner
from worker.stages.benchmark import timing_workload, to_device

SOLUTIONS = ("triton_bf16_partials", "triton")
PROBLEM = "rmsnorm_backward"


SCRUBBED_ENV = runner.scrubbed_env


def full_env(home: Path, device: str = "cpu") -> dict[str, str]:
    env = dict(os.environ)
    env.update(SCRUBBED_ENV(home, device))
    return env


def sandbox_time(solution: Any, args: list[Any], specs: list[dict[str, Any]], env: str) -> TimingSample:
    if env == "full":
        runner.scrubbed_env = full_env  # type: ignore[assignment]
    try:
        with Sandbox("cuda") as sb:
            sb.load(solution)
            reply = sb.request("time", {"args": args, "outputs": specs, **GPU_TIMING.model_dump()})
    finally:
        runner.scrubbed_env = SCRUBBED_ENV  # type: ignore[assignment]
    return TimingSample(times_ms=reply["times_ms"], clock=reply["clock"], host_times_ms=reply.get("host_times_ms"))


def _row(label: str, s: TimingSample) -> dict[str, Any]:
    return {
        "how": label,
        "device_ms": s.median_ms,
        "host_ms": s.host_median_ms,
        "launch_bound": s.launch_bound,
        "device_ms_p10_p90": [statistics.quantiles(s.times_ms, n=10)[0], statistics.quantiles(s.times_ms, n=10)[-1]],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ns = ap.parse_args()
    if not torch.cuda.is_available():
        print("CUDA is not available", file=sys.stderr)
        return 2
    problem = load_catalogue().get(PROBLEM)
    definition = problem.definition
    reference = Reference.of(definition)
    w = timing_workload(problem, "gpu")
    case = build_case(definition, reference, w, seed=1234, folder=problem.folder)
    args, specs = case.args(definition), case.output_specs(definition)
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        dropped = sorted(set(os.environ) - set(runner.scrubbed_env(home, "cuda")))
    print(f"variables the scrub drops (names only): {dropped}", flush=True)
    out: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "cpu_count": os.cpu_count(),
        "workload": w.uuid,
        "env_dropped_by_scrub": dropped,
        "rows": {},
    }
    for name in SOLUTIONS:
        solution = problem.example_solution(name)
        rows: list[dict[str, Any]] = []
        # the parent has no CUDA context yet at the first sandbox timing of the first solution
        with tempfile.TemporaryDirectory(prefix="kaudit-gap-") as tmp:
            fn = import_solution(solution, Path(tmp))
            for r in range(ns.rounds):
                rows.append(
                    {"round": r, **_row("sandbox_scrubbed_env", sandbox_time(solution, args, specs, "scrubbed"))}
                )
                rows.append({"round": r, **_row("sandbox_full_env", sandbox_time(solution, args, specs, "full"))})
                dev_args = to_device(args, "cuda")
                outs = [torch.empty(tuple(s["shape"]), dtype=to_torch(s["dtype"]), device="cuda") for s in specs]
                call = lambda: fn(*dev_args, *outs)  # noqa: E731, B023 - timed in this iteration
                call()
                torch.cuda.synchronize()
                rows.append({"round": r, **_row("parent", time_trusted(call, "cuda", GPU_TIMING))})
                rows.append({"round": r, "how": "do_bench", "device_ms": do_bench_median(call)})
                for row in rows[-4:]:
                    host = f", host {row['host_ms']:.3f} ms" if row.get("host_ms") is not None else ""
                    print(f"{name:22s} round {r} {row['how']:22s} {row['device_ms']:.4f} ms{host}", flush=True)
        out["rows"][name] = rows
        ns.out.write_text(json.dumps(out, indent=1))
    for name, rows in out["rows"].items():
        print(f"\n{name}: median over rounds")
        for how in ("sandbox_scrubbed_env", "sandbox_full_env", "parent", "do_bench"):
            dev = [r["device_ms"] for r in rows if r["how"] == how]
            host = [r["host_ms"] for r in rows if r["how"] == how and r.get("host_ms") is not None]
            print(
                f"  {how:22s} device {statistics.median(dev):.4f} ms"
                + (f", host {statistics.median(host):.4f} ms" if host else "")
            )
    ns.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
