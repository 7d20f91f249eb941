"""Where the GPU canary's training time goes: one stacked training alone, two side by side, and a profile.

  python benchmarks/gpu_canary_step.py --out canary_step.json [--problems embedding_backward,cross_entropy]

Per problem (the op at its canary site, the definition's reference as the kernel, the GPU profile), each in a fresh
process that first runs the spare child's warm-up (worker.canary.warm):
- `child`: the submission's side, one run per optimiser stacked (K = 2), 100 steps;
- `parent`: the reference's side with one 1-ulp null per optimiser (K = 4), as before lazy nulls;
- `child` and `parent` in two processes at once, as an audit runs them;
- a torch.profiler trace of `child` over 10 steady steps: host time per step against the GPU's kernel time.
Each process reports the wall time of its first 5 steps and of the other 95, synchronised at both marks.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FIRST = 5


def _setup(problem_name: str, members: str, device_name: str) -> tuple[Any, ...]:
    import torch

    from worker.canary.binding import bind
    from worker.canary.data import canary_text
    from worker.canary.model import init_state
    from worker.canary.profiles import profile_for
    from worker.canary.train import perturbed_kernel, reference_kernel
    from worker.catalogue import load_catalogue
    from worker.reference import Reference

    problem = load_catalogue().get(problem_name)
    assert problem.spec.canary is not None
    binding = bind(problem.spec.canary.site, problem.definition)
    p = profile_for("gpu")
    seed = 1234
    text = canary_text(p, seed, None)
    init = init_state(p, binding.site, seed)
    ref = reference_kernel(Reference.of(problem.definition).run_fn)
    device = torch.device(device_name)
    if members == "child":
        kernels, opts = [ref, ref], ["sgd", "adamw"]
    else:
        kernels = [ref, perturbed_kernel(ref, seed + 1000, device), ref, perturbed_kernel(ref, seed + 1001, device)]
        opts = ["sgd", "sgd", "adamw", "adamw"]
    return p, binding, kernels, init, text.batches, opts, device


def one(problem_name: str, members: str, profile: bool, device_name: str, steps: int) -> dict[str, Any]:
    """Runs in its own process: warm-up, then the stacked training, timed (and optionally profiled)."""
    import torch

    from worker.canary.stacked import train_stacked
    from worker.canary.warm import warm_up

    p, binding, kernels, init, batches, opts, device = _setup(problem_name, members, device_name)
    batches = batches[:steps]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t = time.perf_counter()
    torch.zeros(1, device=device)
    init_s = time.perf_counter() - t
    warm_s = warm_up(device)
    out: dict[str, Any] = {
        "problem": problem_name,
        "members": members,
        "k": len(kernels),
        "cuda_init_s": round(init_s, 2),
        "warm_up_s": round(warm_s, 2),
    }
    sync()
    t = time.perf_counter()
    train_stacked(p, binding, kernels, init, batches[:FIRST], opts, device, ())
    sync()
    out["first_steps_s"] = round(time.perf_counter() - t, 3)
    t = time.perf_counter()
    train_stacked(p, binding, kernels, init, batches[FIRST:], opts, device, tuple(p.checkpoints))
    sync()
    rest = time.perf_counter() - t
    out["rest_steps"] = int(batches.shape[0]) - FIRST
    out["rest_s"] = round(rest, 3)
    out["ms_per_step"] = round(1000 * rest / out["rest_steps"], 2)
    if device.type == "cuda":
        out["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as tprofile

        n = 10
        kinds = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with tprofile(activities=kinds) as prof:
            t = time.perf_counter()
            train_stacked(p, binding, kernels, init, batches[:n], opts, device, ())
            sync()
            wall = time.perf_counter() - t
        events = prof.key_averages()
        gpu_us = sum(e.self_device_time_total for e in events)
        launches = sum(
            e.count
            for e in events
            if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")
        )
        out["profile"] = {
            "steps": n,
            "wall_ms_per_step": round(1000 * wall / n, 2),
            "gpu_kernel_ms_per_step": round(gpu_us / 1000 / n, 2),
            "kernel_launches_per_step": round(launches / n, 1),
            "top_by_host": events.table(sort_by="self_cpu_time_total", row_limit=20),
            "top_by_gpu": events.table(sort_by="self_cuda_time_total", row_limit=20),
        }
    return out


def spawn(problem: str, members: str, profile: bool, device: str, steps: int) -> subprocess.Popen[str]:
    argv = [sys.executable, __file__, "--one", problem, members, "--device", device, "--steps", str(steps)]
    argv += ["--profile"] if profile else []
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)


def collect(procs: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    rows = []
    for pr in procs:
        stdout, _ = pr.communicate()
        line = [x for x in stdout.splitlines() if x.startswith("{")]
        rows.append(json.loads(line[-1]) if pr.returncode == 0 and line else {"error": f"exit {pr.returncode}"})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--problems", default="embedding_backward,cross_entropy")
    ap.add_argument("--one", nargs=2, metavar=("PROBLEM", "MEMBERS"))
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--device", default="cuda", help="cpu only to try the script out: the sizes are the GPU profile's")
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], args.profile, args.device, args.steps)), flush=True)
        return
    import torch

    result: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else args.device,
        "torch": torch.__version__,
        "runs": [],
    }
    for problem in args.problems.split(","):
        for label, procs in (
            ("child alone", [("child", True)]),
            ("parent alone", [("parent", False)]),
            ("child and parent at once", [("child", False), ("parent", False)]),
        ):
            rows = collect([spawn(problem, m, prof, args.device, args.steps) for m, prof in procs])
            for r in rows:
                r["run"] = label
                brief = {k: v for k, v in r.items() if k != "profile"}
                print(json.dumps(brief), flush=True)
                if "profile" in r:
                    pr = r["profile"]
                    print(
                        f"profile: {pr['wall_ms_per_step']} ms/step wall, {pr['gpu_kernel_ms_per_step']} ms GPU kernels, "
                        f"{pr['kernel_launches_per_step']} launches/step\n{pr['top_by_host']}\n{pr['top_by_gpu']}",
                        flush=True,
                    )
            result["runs"] += rows
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
