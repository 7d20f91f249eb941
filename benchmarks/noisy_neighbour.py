"""Noisy neighbour: how far do other work on the GPU move a correct kernel's measured time and speedup?

  python benchmarks/noisy_neighbour.py --out DIR            (defaults: 5 repeats per scenario, N = 4 audits at once)
  python benchmarks/noisy_neighbour.py --out DIR --quick    (2 repeats, N = 3, a smaller hog: a few minutes)

One correct kernel (--kernel, default rmsnorm_forward/triton) is put through the benchmark stage (intake and
benchmark: the interleaved kernel/reference timing, its bootstrap interval, the re-time, the floor) --repeats times,
with the same seeds, in each scenario:

  alone          nothing else on the GPU
  audits         beside N-1 honest audits (every stage, canary included) looping in other processes, with the
                 per-GPU timed-window lock on: their probes, oracles and canaries overlap the measurement, their own
                 timed windows do not (worker.numerics.timed_window)
  audits_nolock  the same with KAUDIT_TIMING_LOCK=0: timed windows may overlap too
  hostile        beside a process that saturates the GPU in bursts (bf16 matmuls for --burst-ms, idle for --gap-ms);
                 it takes no lock, as a tenant outside the service would not
  mixed          N-1 others at once: N-2 honest audits (with the lock) and the bursty hog (without)

It prints a table (median speedup and kernel time, their spread over the repeats, how far each median moved from
the alone one, the median interval width, how many intervals cover the alone speedup, re-times, lock waits, and the
neighbours' own throughput in audits per hour) and writes DIR/noisy_neighbour.json (every run) and
DIR/noisy_neighbour.md (the table). Needs a CUDA GPU; exits with status 2 without one. With --lock-clocks (root)
the stage locks the graphics clock during its timed window (KAUDIT_LOCK_GPU_CLOCKS=max) and the report says
whether that worked.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing
import os
import statistics
import sys
import time
import traceback
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SCENARIOS = ("alone", "audits", "audits_nolock", "hostile", "mixed")
NEIGHBOUR_EXAMPLES = (
    "embedding_backward/pytorch_fp32",
    "rmsnorm_backward/triton",
    "cross_entropy/triton",
    "embedding_rmsnorm_backward/triton_fp32",
)
ALL_STAGES = ("intake", "static", "benchmark", "probes", "canary")
MEASURED_STAGES = ("intake", "benchmark")
READY_TIMEOUT_S = 600.0
SPAWN = multiprocessing.get_context("spawn")


def require_gpu(device: str) -> str:
    """The GPU's name, or exit loudly: this measures GPU timing and means nothing on a CPU."""
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
        print(
            f"noisy_neighbour.py needs a CUDA GPU (device {device!r}, torch.cuda.is_available() = "
            f"{torch.cuda.is_available()}); nothing was measured",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return str(torch.cuda.get_device_name(torch.device(device)))


def measure(kernel: str, device: str, seed: int) -> dict[str, Any]:
    """One benchmark stage of `kernel` in this process: what its timing recorded."""
    from worker.catalogue import load_catalogue
    from worker.engine import run_audit

    problem_name, solution_name = kernel.split("/")
    problem = load_catalogue().get(problem_name)
    t0 = time.perf_counter()
    report = run_audit(
        problem, problem.example_solution(solution_name), device=device, stages=MEASURED_STAGES, seed=seed
    )
    bench = {s.name: s for s in report.stages}["benchmark"]
    timing = bench.metrics.get("timing") or {}
    keys = (
        "speedup",
        "speedup_ci",
        "speedup_ci_rel_width",
        "kernel_median_ms",
        "reference_median_ms",
        "retimed",
        "first_speedup_ci",
        "reps",
        "blocks",
        "exclusive",
        "lock_wait_s",
        "clocks_locked",
        "clocks_note",
        "bandwidth_floor_ms",
        "hardware",
    )
    return {
        "status": str(bench.status),
        "summary": bench.summary[:400],
        "wall_s": round(time.perf_counter() - t0, 2),
        **{k: timing.get(k) for k in keys},
    }


def neighbour(
    examples: list[str], device: str, seed: int, ready: Event, stop: Event, finished: Any, completed: Any
) -> None:
    """Full audits of honest kernels, one after another, until told to stop."""
    import torch

    from worker.catalogue import load_catalogue
    from worker.engine import run_audit

    torch.cuda.init()
    catalogue = load_catalogue()
    ready.set()
    i = 0
    while not stop.is_set():
        problem_name, solution_name = examples[i % len(examples)].split("/")
        problem = catalogue.get(problem_name)
        complete = False
        try:
            report = run_audit(
                problem, problem.example_solution(solution_name), device=device, stages=ALL_STAGES, seed=seed + i
            )
            errors = [f"{s.name}: {s.summary[:200]}" for s in report.stages if str(s.status) == "error"]
            complete = not errors
            if errors:  # an audit with a stage in error did less work than a real one: not counted as throughput
                print(f"neighbour audit of {examples[i % len(examples)]} ended with errors: {errors}", flush=True)
        except Exception:  # noqa: BLE001 - a neighbour's failure must not stop the measurement; it is counted
            traceback.print_exc()
        with finished.get_lock():
            finished.value += 1
        if complete:
            with completed.get_lock():
                completed.value += 1
        i += 1


def hog(device: str, size: int, burst_ms: float, gap_ms: float, ready: Event, stop: Event, busy_s: Any) -> None:
    """Saturate the GPU with bf16 matmuls for `burst_ms`, leave it idle for `gap_ms`, and again, until told to stop."""
    import torch

    dev = torch.device(device)
    a = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    torch.cuda.synchronize(dev)
    ready.set()
    while not stop.is_set():
        t0 = time.perf_counter()
        end = t0 + burst_ms / 1e3
        while time.perf_counter() < end:
            for _ in range(4):
                a @ b
            torch.cuda.synchronize(dev)
        with busy_s.get_lock():
            busy_s.value += time.perf_counter() - t0
        stop.wait(gap_ms / 1e3)


class Background:
    """The scenario's other processes: started before its measurements, stopped after them."""

    def __init__(self, scenario: str, args: argparse.Namespace) -> None:
        self.stop = SPAWN.Event()
        self.finished = SPAWN.Value("i", 0)
        self.completed = SPAWN.Value("i", 0)  # neighbour audits every stage of which ran (none in error)
        self.busy_s = SPAWN.Value("d", 0.0)
        self.procs: list[Any] = []
        self.readies: list[Event] = []
        honest = args.n - 1 if scenario.startswith("audits") else args.n - 2 if scenario == "mixed" else 0
        if honest > 0:
            for k in range(honest):
                ready = SPAWN.Event()
                examples = list(NEIGHBOUR_EXAMPLES[k % len(NEIGHBOUR_EXAMPLES) :]) + list(NEIGHBOUR_EXAMPLES)
                self.procs.append(
                    SPAWN.Process(
                        target=neighbour,
                        args=(examples, args.device, 1000 * (k + 1), ready, self.stop, self.finished, self.completed),
                        daemon=True,
                    )
                )
                self.readies.append(ready)
        if scenario in ("hostile", "mixed"):
            ready = SPAWN.Event()
            self.procs.append(
                SPAWN.Process(
                    target=hog,
                    args=(args.device, args.matmul, args.burst_ms, args.gap_ms, ready, self.stop, self.busy_s),
                    daemon=True,
                )
            )
            self.readies.append(ready)

    def __enter__(self) -> Background:
        for p in self.procs:
            p.start()
        for ready, p in zip(self.readies, self.procs):
            if not ready.wait(READY_TIMEOUT_S):
                raise RuntimeError(f"a background process (pid {p.pid}) did not get ready in {READY_TIMEOUT_S:.0f} s")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for p in self.procs:
            # a neighbour finishes the audit it is in (its sandbox child is cleaned up); a stuck one is ended
            p.join(300)
            if p.is_alive():
                p.terminate()
                p.join(30)


def _q(xs: list[float]) -> tuple[float | None, float | None, float | None]:
    return (min(xs), statistics.median(xs), max(xs)) if xs else (None, None, None)


def _moved(value: float | None, alone: float | None) -> float | None:
    return value / alone - 1 if value is not None and alone else None


def summarise(
    scenario: str, runs: list[dict[str, Any]], alone: dict[str, Any] | None, extra: dict[str, Any]
) -> dict[str, Any]:
    ok = [r for r in runs if r.get("speedup") is not None]
    speedups = [r["speedup"] for r in ok]
    kernel = [r["kernel_median_ms"] for r in ok if r.get("kernel_median_ms") is not None]
    widths = [r["speedup_ci_rel_width"] for r in ok if r.get("speedup_ci_rel_width") is not None]
    alone_speedup = alone["speedup_median"] if alone else None
    covers = [r for r in ok if alone_speedup is not None and r["speedup_ci"][0] <= alone_speedup <= r["speedup_ci"][1]]
    lo_s, med_s, hi_s = _q(speedups)
    lo_k, med_k, hi_k = _q(kernel)
    return {
        "scenario": scenario,
        "runs": len(runs),
        "passed": sum(r["status"] == "passed" for r in runs),
        "speedup_median": med_s,
        "speedup_spread": (hi_s / lo_s - 1) if lo_s else None,
        "kernel_ms_median": med_k,
        "kernel_ms_spread": (hi_k / lo_k - 1) if lo_k else None,
        "speedup_vs_alone": _moved(med_s, alone_speedup),
        "kernel_ms_vs_alone": _moved(med_k, alone["kernel_ms_median"] if alone else None),
        "ci_rel_width_median": statistics.median(widths) if widths else None,
        "ci_covers_alone": f"{len(covers)}/{len(ok)}" if alone_speedup is not None else "-",
        "retimed": sum(bool(r.get("retimed")) for r in ok),
        "lock_wait_s_median": statistics.median([r.get("lock_wait_s") or 0.0 for r in ok]) if ok else None,
        "exclusive": all(bool(r.get("exclusive")) for r in ok),
        "clocks_locked": all(bool(r.get("clocks_locked")) for r in ok) if ok else None,
        **extra,
    }


COLUMNS = (
    ("scenario", "{}"),
    ("runs", "{}"),
    ("passed", "{}"),
    ("speedup_median", "{:.3f}"),
    ("speedup_spread", "{:.1%}"),
    ("kernel_ms_median", "{:.4f}"),
    ("kernel_ms_spread", "{:.1%}"),
    ("speedup_vs_alone", "{:+.1%}"),
    ("kernel_ms_vs_alone", "{:+.1%}"),
    ("ci_rel_width_median", "{:.1%}"),
    ("ci_covers_alone", "{}"),
    ("retimed", "{}"),
    ("lock_wait_s_median", "{:.2f}"),
    ("exclusive", "{}"),
    ("neighbour_audits", "{}"),
    ("neighbour_audits_errored", "{}"),
    ("neighbour_audits_per_hour", "{:.0f}"),
    ("hog_busy_share", "{:.0%}"),
)


def table(rows: list[dict[str, Any]]) -> str:
    head = "| " + " | ".join(c for c, _ in COLUMNS) + " |"
    lines = [head, "|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = [("-" if r.get(c) is None else fmt.format(r[c])) for c, fmt in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for noisy_neighbour.json and noisy_neighbour.md")
    ap.add_argument("--quick", action="store_true", help="2 repeats, N = 3, a 4096 matmul hog")
    ap.add_argument("--kernel", default="rmsnorm_forward/triton", help="problem/solution of the measured kernel")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--n", type=int, default=None, help="audits at once in the 'audits' scenarios (N-1 neighbours)")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--matmul", type=int, default=None, help="the hog's square bf16 matmul size")
    ap.add_argument("--burst-ms", type=float, default=50.0)
    ap.add_argument("--gap-ms", type=float, default=50.0)
    ap.add_argument("--lock-clocks", action="store_true", help="KAUDIT_LOCK_GPU_CLOCKS=max for the stage (needs root)")
    ap.add_argument("--seed", type=int, default=20251203)
    args = ap.parse_args()
    args.n = args.n or (3 if args.quick else 4)
    args.repeats = args.repeats or (2 if args.quick else 5)
    args.matmul = args.matmul or (4096 if args.quick else 8192)
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        ap.error(f"unknown scenarios {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")
    gpu = require_gpu(args.device)
    if args.lock_clocks:
        os.environ["KAUDIT_LOCK_GPU_CLOCKS"] = "max"
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    meta = {
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "gpu": gpu,
        "torch": torch.__version__,
        "kernel": args.kernel,
        "n": args.n,
        "repeats": args.repeats,
        "matmul": args.matmul,
        "burst_ms": args.burst_ms,
        "gap_ms": args.gap_ms,
        "lock_clocks_asked": args.lock_clocks,
        "host_cpus": os.cpu_count(),
        "seed": args.seed,
    }
    print(f"noisy neighbour on {gpu}: {args.kernel}, {args.repeats} repeats, N = {args.n}", flush=True)
    warm = measure(
        args.kernel, args.device, args.seed - 1
    )  # imports, Triton's compile, first CUDA kernels: not counted
    print(f"warm-up: {warm['status']} in {warm['wall_s']} s", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {}
    summaries: list[dict[str, Any]] = []
    alone: dict[str, Any] | None = None
    for scenario in scenarios:
        os.environ["KAUDIT_TIMING_LOCK"] = "0" if scenario == "audits_nolock" else "1"  # this process and its children
        with Background(scenario, args) as bg:
            t0 = time.perf_counter()  # after the others are ready: their start-up is not their throughput
            before, before_complete = bg.finished.value, bg.completed.value
            runs[scenario] = []
            for r in range(args.repeats):
                row = measure(args.kernel, args.device, args.seed + r)
                runs[scenario].append(row)
                print(
                    f"  {scenario} #{r + 1}: {row['status']} speedup {row.get('speedup')} ci {row.get('speedup_ci')} "
                    f"kernel {row.get('kernel_median_ms')} ms, lock wait {row.get('lock_wait_s')} s",
                    flush=True,
                )
            elapsed = time.perf_counter() - t0
            done = bg.completed.value - before_complete
            neighbours = scenario.startswith("audits") or scenario == "mixed"
            extra = {
                "neighbour_audits": done if neighbours else None,
                "neighbour_audits_errored": bg.finished.value - before - done if neighbours else None,
                "neighbour_audits_per_hour": done / elapsed * 3600 if neighbours else None,
                "hog_busy_share": bg.busy_s.value / elapsed if scenario in ("hostile", "mixed") else None,
            }
        summary = summarise(scenario, runs[scenario], alone, extra)
        if scenario == "alone":
            alone = summary
            summary = summarise(scenario, runs[scenario], alone, extra)
        summaries.append(summary)
        write(args.out, meta, summaries, runs, warm)  # after every scenario: a run cut short keeps what it measured
    print("\n" + table(summaries), flush=True)
    return 0


def write(out: Path, meta: dict[str, Any], summaries: list[dict[str, Any]], runs: dict[str, Any], warm: Any) -> None:
    meta = {**meta, "ended": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    (out / "noisy_neighbour.json").write_text(
        json.dumps({"meta": meta, "summary": summaries, "runs": runs, "warmup": warm}, indent=1, default=str)
    )
    (out / "noisy_neighbour.md").write_text(
        f"# noisy neighbour: {meta['kernel']} on {meta['gpu']}\n\n{json.dumps(meta)}\n\n{table(summaries)}\n"
    )


if __name__ == "__main__":
    sys.exit(main())
