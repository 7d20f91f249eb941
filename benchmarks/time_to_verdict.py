"""Time to verdict: audit every example with every stage, alone and then N at once, and record where the time goes.

  python benchmarks/time_to_verdict.py --device cuda --n 1,4,8 --out benchmarks/results/time_to_verdict_h200.json
  python benchmarks/time_to_verdict.py --device cpu --n 1 --only 'embedding_backward/*' --out /tmp/ttv_cpu.json

For each N, the selected examples (kernels/*/solutions/*, those whose target_hardware runs on the device)
are audited N at a time by N spawned worker processes (benchmarks/parallel.py). By default each worker is warm, as a
long-lived audit worker is: before its first measured audit it has run one warm-up audit and started a spare sandbox
child (worker.sandbox.pool), and it waits for the next spare (started when the previous audit took its child) before
the next audit's clock starts; `--cold` measures fresh processes instead. Recorded per audit:
wall time, each stage's duration, the verdict and whether every stage did what benchmarks/expectations.py
says, and on a GPU the audit process's peak torch allocation (the sandbox child's is separate and not in it).
Per N: the batch's wall time, audits per GPU-hour (per machine-hour on the CPU) and, on a GPU, the lowest
free device memory seen while the batch ran (torch.cuda.mem_get_info polled every 0.2 s: every process).
Writes FILE.json and FILE.md (a summary table) and prints the summary. Every audit's sandbox child is still
started fresh, in namespaces of its own, and serves that one audit.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fnmatch
import hashlib
import json
import logging
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.audit_examples import audit_row, device_name
from benchmarks.expectations import runs_on
from benchmarks.parallel import run_jobs
from worker.catalogue import load_catalogue
from worker.engine import parse_stages

GIB = 2**30


# a warm worker process's own state (this script's spawned processes only): its spare sandbox children
_WARM: dict[str, Any] = {}


WARMUP_STAGES = ("intake", "static", "benchmark")  # enough for the engine's lazy imports, cheap with N warming at once


def warm_worker(
    device: str,
    warmup: tuple[str, str] | None,
    warm_child: bool | None = None,
    stages: tuple[str, ...] = WARMUP_STAGES,
    warm_parent: bool = True,
) -> None:
    """What a long-lived audit worker has done before its next audit: the engine imported, the catalogue loaded,
    the device initialised, a spare sandbox child started (worker.sandbox.pool) and, with `warmup`, one audit
    run already (lazy imports, the text's tokenizer, the first CUDA kernels). Runs once per spawned process."""
    import torch

    from worker.sandbox.pool import SandboxPool

    t = time.perf_counter()
    if device.startswith("cuda"):
        torch.cuda.init()
        torch.empty(1, device=device)
    pool = SandboxPool(device, warm=warm_child)
    pool.prestart()
    _WARM["pool"] = pool
    if warmup is not None:
        row = audit_row(warmup[0], warmup[1], device, stages, pool=pool)
        _WARM["warmup"] = {"example": "/".join(warmup), "wall_s": row["wall_s"], "verdict": row["verdict"]}
    if warm_parent and device.startswith(
        "cuda"
    ):  # as the Celery worker's process does at its start (app/jobs/resources.py)
        from worker.canary.parent_warm import warm_parent as warm_canary

        _WARM["parent_warm_s"] = warm_canary(torch.device(device), load_catalogue())
    _WARM["setup_s"] = round(time.perf_counter() - t, 2)


def audit_seed(seed_base: int | None, problem: str, solution: str) -> int | None:
    """With a seed base, each example's audit seed is fixed (so is its canary seed: a second batch with the same base
    finds the parent's canary runs in the worker's cache); without one, a fresh random seed per audit."""
    if seed_base is None:
        return None
    digest = hashlib.sha256(f"{seed_base}/{problem}/{solution}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 2


def timed_audit(
    problem: str, solution: str, device: str, stages: tuple[str, ...], seed: int | None = None
) -> dict[str, Any]:
    """One audit in this (spawned) process: audit_examples.audit_row plus stage times and memory."""
    import torch

    cuda = device.startswith("cuda")
    pool = _WARM.get("pool")
    if pool is not None:
        # the spare started when the previous audit took its child, an audit's length ago: a busy worker finds it ready
        pool.wait_ready()
    started = time.time()
    if cuda:
        torch.cuda.init()
        torch.cuda.reset_peak_memory_stats()
        free_before, total = torch.cuda.mem_get_info()
    fallbacks = FallbackCount()
    placement_log = logging.getLogger("worker.numerics.placement")
    placement_log.addHandler(fallbacks)
    try:
        row = audit_row(problem, solution, device, stages, pool=pool, seed=seed)
    finally:
        placement_log.removeHandler(fallbacks)
    out: dict[str, Any] = {k: row[k] for k in ("problem", "solution", "verdict", "wall_s", "statuses")}
    # trusted fp64 work that ran out of GPU memory and moved to the CPU (worker.numerics.placement): slow, same answer
    out["cpu_fallbacks"] = fallbacks.count
    out["mismatches"] = [m for m in row["mismatches"] if not is_designed_skip(m)]
    out["matches_expectation"] = not out["mismatches"]
    out["summary"] = row["summary"][:300]
    out["stage_s"] = {s["name"]: s.get("duration_s") for s in row["stages"] if s["name"] in stages}
    # an auditor error's own message (the verdict's summary names only the first stage that caught the kernel)
    out["errors"] = {s["name"]: str(s.get("summary", ""))[:600] for s in row["stages"] if s.get("status") == "error"}
    canary = next((s for s in row["stages"] if s["name"] == "canary"), None)
    if canary is not None and canary.get("metrics", {}).get("timings"):
        m = canary["metrics"]
        out["canary"] = {
            k: m.get(k) for k in ("timings", "runs", "loss_gap", "loss_threshold", "noise_band", "fidelity_worst_ratio")
        }
    probes = next((s for s in row["stages"] if s["name"] == "probes"), None)
    if probes is not None and probes.get("metrics", {}).get("timings"):
        out["probes"] = {
            "timings": probes["metrics"]["timings"],
            "per_probe": {k: v.get("timings") for k, v in probes["metrics"].get("probes", {}).items()},
        }
    out["wall_without_canary_s"] = round(row["wall_s"] - (out["stage_s"].get("canary") or 0.0), 2)
    out["pid"] = os.getpid()
    out["warm_worker"] = {k: v for k, v in _WARM.items() if k != "pool"} if pool is not None else None
    out["started"], out["ended"] = started, time.time()
    if cuda:
        free_after, _ = torch.cuda.mem_get_info()
        out["gpu"] = {
            "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / GIB, 3),
            "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / GIB, 3),
            "reserved_after_gib": round(torch.cuda.memory_reserved() / GIB, 3),
            "free_before_gib": round(free_before / GIB, 2),
            "free_after_gib": round(free_after / GIB, 2),
            "total_gib": round(total / GIB, 2),
        }
    return out


class FallbackCount(logging.Handler):
    """Counts worker.numerics.placement's warnings: trusted GPU work that ran out of memory and ran on the CPU."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def is_designed_skip(mismatch: str) -> bool:
    """The canary skips by design (an op with no canary site, a Triton kernel on the CPU): not a mismatch."""
    return mismatch.startswith("canary: skipped")


class FreeMemoryWatch:
    """Polls the device's free memory (all processes) in a thread; `lowest` is the minimum seen."""

    def __init__(self, device: str, every_s: float = 0.2) -> None:
        self.device, self.every_s = device, every_s
        self.lowest: int | None = None
        self.total: int | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        import torch

        while True:
            free, self.total = torch.cuda.mem_get_info(torch.device(self.device))
            self.lowest = free if self.lowest is None else min(self.lowest, free)
            if self._done.wait(self.every_s):
                return

    def __enter__(self) -> FreeMemoryWatch:
        if self.device.startswith("cuda"):
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()


def machine(device: str) -> str:
    """The card, or the CPU's model name (from /proc/cpuinfo where there is one) and core count."""
    if device.startswith("cuda"):
        return device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    names = (
        [ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines() if ln.startswith("model name")]
        if cpuinfo.exists()
        else []
    )
    return f"{names[0]} ({os.cpu_count()} cores)" if names else device_name(device)


def select(only: str, device: str) -> list[tuple[str, str]]:
    patterns = [s.strip() for s in only.split(",") if s.strip()]
    todo = []
    for problem in load_catalogue():
        for sname, sol in problem.example_solutions().items():
            key = f"{problem.name}/{sname}"
            if runs_on(sol.spec, device) and (not patterns or any(fnmatch.fnmatch(key, pat) for pat in patterns)):
                todo.append((problem.name, sname))
    return todo


def summarise(
    n: int, rows: list[dict[str, Any]], wall_s: float, planned: int, watch: FreeMemoryWatch | None
) -> dict[str, Any]:
    stages: dict[str, list[float]] = {}
    for r in rows:
        for name, secs in r["stage_s"].items():
            if secs is not None:
                stages.setdefault(name, []).append(secs)
    walls = [r["wall_s"] for r in rows]
    # throughput from the first audit's start to the last one's end: the pool's process start (torch import) is left out,
    # as a service's warm worker process would not pay it per batch
    span = max(r["ended"] for r in rows) - min(r["started"] for r in rows) if rows else 0.0
    s: dict[str, Any] = {
        "n": n,
        "planned": planned,
        "finished": len(rows),
        "batch_wall_s": round(wall_s, 1),
        "audits_span_s": round(span, 1),
        "audits_per_hour": round(len(rows) / span * 3600, 1) if span > 0 else None,
        "audit_wall_s": {"mean": round(statistics.mean(walls), 2), "max": round(max(walls), 2)} if walls else None,
        "audit_wall_without_canary_s_max": max((r["wall_without_canary_s"] for r in rows), default=None),
        "stage_s": {k: {"mean": round(statistics.mean(v), 2), "max": round(max(v), 2)} for k, v in stages.items()},
        "all_match": all(r["matches_expectation"] for r in rows),
        "mismatches": [
            f"{r['problem']}/{r['solution']}: {'; '.join(r['mismatches'])}" for r in rows if r["mismatches"]
        ],
    }
    peaks = [r["gpu"]["peak_allocated_gib"] for r in rows if "gpu" in r]
    if peaks:
        s["gpu_peak_allocated_gib_max"] = max(peaks)
        s["gpu_peak_reserved_gib_max"] = max(r["gpu"]["peak_reserved_gib"] for r in rows if "gpu" in r)
    s["cpu_fallbacks"] = sum(r.get("cpu_fallbacks", 0) for r in rows)
    if watch is not None and watch.lowest is not None and watch.total is not None:
        s["gpu_lowest_free_gib"] = round(watch.lowest / GIB, 2)
        s["gpu_most_used_gib"] = round((watch.total - watch.lowest) / GIB, 2)
    return s


def markdown(meta: dict[str, Any], batches: list[dict[str, Any]]) -> str:
    unit = "GPU-hour" if meta["device_kind"] == "cuda" else "machine-hour"
    lines = [
        f"# Time to verdict, {meta['device']} ({meta['date']})",
        "",
        f"torch {meta['torch']}; stages {', '.join(meta['stages'])}; load average before {meta['load_before']}, "
        f"after {meta.get('load_after')}.",
        "",
    ]
    cores = meta.get("cores") or os.cpu_count() or 1
    # the audits themselves load the machine (parent and child at once), so only the load before them tells of others
    if meta["load_before"][0] > cores / 2:
        lines += [
            f"**The machine was shared when this started** (load average {meta['load_before'][0]} on {cores} cores): "
            "wall times may be inflated by other work.",
            "",
        ]
    if meta.get("note"):
        lines += [f"Note: {meta['note']}.", ""]
    for b in batches:
        s = b["summary"]
        lines += [
            f"## N = {s['n']} at once: {s['finished']} of {s['planned']} audits in {s['audits_span_s']} s "
            f"({s['batch_wall_s']} s with the pool's process start), "
            f"{s['audits_per_hour']} audits per {unit}; every verdict as expected: {s['all_match']}",
            "",
        ]
        if "gpu_peak_allocated_gib_max" in s:
            lines += [
                f"Peak torch allocation in one audit process: {s['gpu_peak_allocated_gib_max']} GiB (reserved by its "
                f"caching allocator: {s.get('gpu_peak_reserved_gib_max')} GiB); device memory "
                f"in use at most {s.get('gpu_most_used_gib')} GiB (all processes). Trusted fp64 work moved to the "
                f"CPU for lack of GPU memory: {s['cpu_fallbacks']} times.",
                "",
            ]
        names = [n for n in meta["stages"] if any(n in r["stage_s"] for r in b["rows"])]
        lines.append("| example | verdict | as expected | wall s | " + " | ".join(f"{n} s" for n in names) + " |")
        lines.append("|---|---|---|---|" + "---|" * len(names))
        for r in b["rows"]:
            cells = [f"{r['stage_s'][n]:.1f}" if r["stage_s"].get(n) is not None else "" for n in names]
            status = {n: r["statuses"].get(n, "") for n in names}
            cells = [f"{c} ({status[n]})" if c else "" for c, n in zip(cells, names)]
            if "canary" in names and ((r.get("canary") or {}).get("timings") or {}).get("parent_read_from_cache"):
                i = names.index("canary")
                cells[i] += ", parent's runs read from its cache"
            lines.append(
                f"| {r['problem']}/{r['solution']} | {r['verdict']} | {r['matches_expectation']} | {r['wall_s']:.1f} | "
                + " | ".join(cells)
                + " |"
            )
        lines.append("")
        for m in s["mismatches"]:
            lines.append(f"- MISMATCH {m}")
        means = ", ".join(f"{k} {v['mean']} s (max {v['max']})" for k, v in s["stage_s"].items())
        lines += [
            f"Stage means: {means}. Longest audit without its canary stage: {s['audit_wall_without_canary_s_max']} s.",
            "",
        ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--n", default="1,4,8", help="comma-separated numbers of audits run at once")
    ap.add_argument(
        "--only", default="", help="comma-separated fnmatch patterns on problem/solution (default: every example)"
    )
    ap.add_argument("--stages", default="intake,static,benchmark,probes,canary")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=float("inf"),
        help="time budget for each N's batch, from when its worker processes are set up",
    )
    ap.add_argument(
        "--cold",
        action="store_true",
        help="no warm worker: no spare sandbox child and no warm-up audit (each process's first audit pays "
        "its imports and its child's start)",
    )
    ap.add_argument(
        "--cold-child",
        action="store_true",
        help="spare children are not warmed up (worker.canary.warm; by default they are on a GPU)",
    )
    ap.add_argument(
        "--cold-text",
        action="store_true",
        help="do not build the text cache first (`kaudit warm-cache`, worker.text.warm): the first audit at "
        "each real-text vocabulary size then tokenises the corpus on its clock",
    )
    ap.add_argument(
        "--cold-parent",
        action="store_true",
        help="on a GPU, the worker process does not warm its side of the canary up first "
        "(worker.canary.parent_warm, as a Celery GPU worker does at its start)",
    )
    ap.add_argument(
        "--warmup-stages",
        default=",".join(WARMUP_STAGES),
        help="stages of the warm-up audit (add canary for a worker whose own process has trained before)",
    )
    ap.add_argument(
        "--warmup", default="", help="PROBLEM/SOLUTION each warm worker audits first (default: the first selected)"
    )
    ap.add_argument(
        "--seed-base",
        type=int,
        default=None,
        help="fixed audit seeds derived from this and each example (default: random); with --n 1,8 the "
        "second batch repeats the first's canary seeds, so its parent runs come from the worker's cache "
        "(worker.canary.parent_cache, KAUDIT_CACHE_DIR shared by the batches)",
    )
    ap.add_argument("--out", required=True, help="FILE.json; FILE.md is written next to it")
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    stages = parse_stages(args.stages)
    todo = select(args.only, args.device)
    if not todo:
        print(f"no example matches {args.only!r} on {args.device}", file=sys.stderr)
        return 2
    ns = [int(x) for x in args.n.split(",") if x.strip()]
    warmup = tuple(args.warmup.split("/", 1)) if args.warmup else todo[0]
    warmup_stages = parse_stages(args.warmup_stages)
    out = Path(args.out)
    meta: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": machine(args.device),
        "device_kind": "cuda" if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "stages": list(stages),
        "cores": os.cpu_count(),
        "seed_base": args.seed_base,
        "examples": [f"{p}/{s}" for p, s in todo],
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "workers": "cold: a fresh process per worker, no spare child"
        if args.cold
        else f"warm: each worker process ran one warm-up audit ({'/'.join(warmup)}, stages {', '.join(warmup_stages)}) "
        "and keeps a spare sandbox child",
    }
    if not args.cold_text:  # what a deployed worker finds on disk (the image bakes it; worker.text.warm)
        from worker.text.warm import vocab_sizes, warm_text_cache

        meta["text_cache_s"] = warm_text_cache(
            vocab_sizes(load_catalogue(), "gpu" if meta["device_kind"] == "cuda" else "cpu")
        )
    batches: list[dict[str, Any]] = []

    def write() -> None:
        out.write_text(json.dumps({"meta": meta, "batches": batches}, indent=1))
        out.with_suffix(".md").write_text(markdown(meta, batches))

    for n in ns:
        rows: list[dict[str, Any]] = []
        order = {key: i for i, key in enumerate(todo)}
        batch: dict[str, Any] = {"summary": {}, "rows": rows}
        batches.append(batch)

        t0 = time.perf_counter()

        def record(
            row: dict[str, Any],
            rows: list[dict[str, Any]] = rows,
            n: int = n,
            order: dict[Any, int] = order,
            batch: dict[str, Any] = batch,
            t0: float = t0,
        ) -> None:
            rows.append(row)
            rows.sort(key=lambda r: order[(r["problem"], r["solution"])])
            print(
                f"[N={n}] {row['problem']}/{row['solution']}: {row['verdict']} in {row['wall_s']:.1f} s "
                + " ".join(f"{k}={v}" for k, v in row["stage_s"].items())
                + ("" if row["matches_expectation"] else "  MISMATCH " + "; ".join(row["mismatches"]))
                + "".join(f"\n    {stage} error: {msg[:300]}" for stage, msg in row["errors"].items()),
                flush=True,
            )
            # written after every audit: a batch cut short by its machine's limit still leaves what it finished
            batch["summary"] = summarise(n, rows, time.perf_counter() - t0, len(todo), None)
            write()

        with FreeMemoryWatch(args.device) as watch:
            run_jobs(
                timed_audit,
                [(p, s, args.device, stages, audit_seed(args.seed_base, p, s)) for p, s in todo],
                workers=n,
                budget_s=args.budget_s,
                on_result=record,
                initializer=None if args.cold else warm_worker,
                initargs=()
                if args.cold
                else (args.device, warmup, False if args.cold_child else None, warmup_stages, not args.cold_parent),
            )
        batch["summary"] = summarise(n, rows, time.perf_counter() - t0, len(todo), watch)
        meta["load_after"] = [round(x, 2) for x in os.getloadavg()]
        write()
        print(json.dumps(batch["summary"]), flush=True)
    print(markdown(meta, batches))
    return 0 if all(b["summary"]["all_match"] and b["summary"]["finished"] == len(todo) for b in batches) else 1


if __name__ == "__main__":
    raise SystemExit(main())
