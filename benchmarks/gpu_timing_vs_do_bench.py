"""Does the benchmark stage's timing agree with triton.testing.do_bench? (target: within 5%)

For every example solution with "triton" in spec.languages in kernels/*/solutions, on the
GPU workload the benchmark stage times (the largest, or audit.json's
timing_workload), this measures the median kernel time three ways:

  sandbox   the benchmark stage's own path: the child's "time" op (CUDA events,
            L2 flushed before each run, median of GPU_TIMING.reps)
  trusted   the stage's in-parent helper (worker.numerics.timing.time_trusted),
            the one the reference is timed with, on the kernel imported here
  do_bench  triton.testing.do_bench(fn, return_mode="median") on the same call

and the problem's reference with `trusted` and `do_bench`. It prints a table
with the % difference of each to do_bench and writes JSON to --out.

Usage (on a CUDA machine):  python benchmarks/gpu_timing_vs_do_bench.py --out results/timing.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from worker.catalogue import Problem, load_catalogue
from worker.formats import Solution
from worker.inputs import build_case
from worker.numerics.dtypes import to_torch
from worker.numerics.timing import GPU_TIMING, TimingSample, time_trusted
from worker.reference import Reference
from worker.sandbox import Sandbox
from worker.stages.benchmark import timing_workload, to_device


def import_solution(solution: Solution, folder: Path) -> Callable[..., Any]:
    """Import the solution here (Triton needs its source on disk for triton.jit)."""
    for src in solution.sources:
        target = folder / src.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(src.content)
    sys.path.insert(0, str(folder))
    name = f"kaudit_timing_{solution.name}_{abs(hash(str(folder)))}"
    spec = importlib.util.spec_from_file_location(name, folder / solution.spec.entry_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return getattr(module, solution.spec.entry_function)  # type: ignore[no-any-return]


def _pct(ms: float, ref_ms: float) -> float:
    return (ms - ref_ms) / ref_ms * 100.0


def do_bench_median(fn: Callable[[], object]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, return_mode="median"))


def measure(problem: Problem, sol_name: str, solution: Solution, device: str) -> dict[str, Any]:
    from worker.catalogue import Profile

    profile: Profile = "gpu"
    definition = problem.definition
    reference = Reference.of(definition)
    w = timing_workload(problem, profile)
    case = build_case(definition, reference, w, seed=1234, folder=problem.folder)
    args = case.args(definition)
    specs = case.output_specs(definition)
    row: dict[str, Any] = {"problem": problem.name, "solution": sol_name, "workload": w.uuid}

    t0 = time.perf_counter()
    with Sandbox(device) as sb:
        sb.load(solution)
        reply = sb.request("time", {"args": args, "outputs": specs, **GPU_TIMING.model_dump()})
    sandbox = TimingSample(times_ms=reply["times_ms"], clock=reply["clock"], host_times_ms=reply.get("host_times_ms"))
    row["sandbox_ms"] = sandbox.median_ms
    row["sandbox_host_ms"] = sandbox.host_median_ms
    row["launch_bound"] = sandbox.launch_bound
    row["sandbox_clock"] = sandbox.clock
    row["tampered"] = reply.get("tampered", [])

    with tempfile.TemporaryDirectory(prefix="kaudit-timing-") as tmp:
        fn = import_solution(solution, Path(tmp))
        dev_args = to_device(args, device)
        outs = [torch.empty(tuple(s["shape"]), dtype=to_torch(s["dtype"]), device=device) for s in specs]
        if solution.spec.destination_passing_style:
            call: Callable[[], object] = lambda: fn(*dev_args, *outs)  # noqa: E731
        else:
            call = lambda: fn(*dev_args)  # noqa: E731
        call()
        torch.cuda.synchronize()
        trusted = time_trusted(call, device, GPU_TIMING)
        row["trusted_ms"] = trusted.median_ms
        row["trusted_host_ms"] = trusted.host_median_ms
        row["do_bench_ms"] = do_bench_median(call)

    ref_args = to_device(args, device)
    ref_call = lambda: reference.run_fn(*ref_args)  # noqa: E731
    with torch.no_grad():
        row["reference_trusted_ms"] = time_trusted(ref_call, device, GPU_TIMING).median_ms
        row["reference_do_bench_ms"] = do_bench_median(ref_call)

    row["sandbox_vs_do_bench_pct"] = _pct(row["sandbox_ms"], row["do_bench_ms"])
    row["trusted_vs_do_bench_pct"] = _pct(row["trusted_ms"], row["do_bench_ms"])
    row["reference_trusted_vs_do_bench_pct"] = _pct(row["reference_trusted_ms"], row["reference_do_bench_ms"])
    row["within_5pct"] = abs(row["sandbox_vs_do_bench_pct"]) <= 5.0 and abs(row["trusted_vs_do_bench_pct"]) <= 5.0
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def _table(rows: list[dict[str, Any]]) -> str:
    head = f"{'problem/solution':48s} {'sandbox':>9s} {'trusted':>9s} {'do_bench':>9s} {'sbx%':>7s} {'tr%':>7s} {'ref tr':>9s} {'ref db':>9s} {'ref%':>7s}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['problem'] + '/' + r['solution']:48s} {r['sandbox_ms']:9.4f} {r['trusted_ms']:9.4f} {r['do_bench_ms']:9.4f} "
            f"{r['sandbox_vs_do_bench_pct']:+6.1f}% {r['trusted_vs_do_bench_pct']:+6.1f}% "
            f"{r['reference_trusted_ms']:9.4f} {r['reference_do_bench_ms']:9.4f} {r['reference_trusted_vs_do_bench_pct']:+6.1f}%"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="where to write the JSON results")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--problems", default="", help="comma-separated problem names (default: all)")
    ns = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("CUDA is not available: this script measures GPU timing only", file=sys.stderr)
        return 2
    wanted = {p for p in ns.problems.split(",") if p}
    rows: list[dict[str, Any]] = []
    errors: list[dict[str, str]] = []
    skipped: list[dict[str, str]] = []
    try:
        catalogue = load_catalogue()
    except Exception as err:  # noqa: BLE001
        print(f"cannot load the catalogue: {err}", file=sys.stderr)
        return 1
    for problem in catalogue:
        if wanted and problem.name not in wanted:
            continue
        try:
            solutions = problem.example_solutions()
        except Exception as err:  # noqa: BLE001
            errors.append({"problem": problem.name, "solution": "*", "error": f"{type(err).__name__}: {err}"})
            print(f"[error] {problem.name}: cannot load solutions: {err}", file=sys.stderr)
            continue
        for name, sol in solutions.items():
            if "triton" not in sol.spec.languages:
                continue
            hw = sol.spec.target_hardware
            if hw and "cuda" not in sol.spec.device_kinds()[0]:  # LOCAL or a GPU name runs on the GPU
                skipped.append({"problem": problem.name, "solution": name, "why": f"target_hardware {hw}"})
                continue
            print(f"[timing] {problem.name}/{name} ...", flush=True)
            try:
                row = measure(problem, name, sol, ns.device)
                rows.append(row)
                print(
                    f"         sandbox {row['sandbox_ms']:.4f} ms, trusted {row['trusted_ms']:.4f} ms, "
                    f"do_bench {row['do_bench_ms']:.4f} ms ({row['sandbox_vs_do_bench_pct']:+.1f}%)",
                    flush=True,
                )
            except Exception as err:  # noqa: BLE001 - one bad solution must not stop the table
                errors.append(
                    {
                        "problem": problem.name,
                        "solution": name,
                        "error": f"{type(err).__name__}: {err}",
                        "traceback": traceback.format_exc()[-3000:],
                    }
                )
                print(f"[error] {problem.name}/{name}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
            finally:
                torch.cuda.empty_cache()
    print()
    if rows:
        print(_table(rows))
        worst = max(abs(r["sandbox_vs_do_bench_pct"]) for r in rows)
        print(
            f"\nworst |sandbox - do_bench| = {worst:.1f}% (target: within 5%); "
            f"{sum(r['within_5pct'] for r in rows)}/{len(rows)} within 5%"
        )
    else:
        print("no triton solutions were timed")
    payload = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "timing_config": GPU_TIMING.model_dump(),
        "rows": rows,
        "errors": errors,
        "skipped": skipped,
    }
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(payload, indent=2))
    print(f"wrote {ns.out}")
    return 0 if rows and not errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
