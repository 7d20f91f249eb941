"""Where an audit's time goes: one audit in this process under cProfile, per stage, plus the sandbox's start-up.

  python benchmarks/profile_audit.py --device cuda --examples embedding_backward/triton_fp32 --out /tmp/prof
  python benchmarks/profile_audit.py --device cpu --examples embedding_backward/pytorch_fp32 --stages intake,benchmark

For each example: the audit's stage durations and the top functions of the trusted process by cumulative and
by own time (the sandbox child's work shows as the parent waiting in `select`). Then the sandbox start-up split
into its parts: a bare `python -c 'import torch'`, the same inside bubblewrap, and `Sandbox.start()` (bwrap,
Python, torch, the device's initialisation) followed by loading the solution. Writes OUT/profile.json and one
OUT/<problem>__<solution>.txt of profile tables per example.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import io
import json
import os
import pstats
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from worker.catalogue import load_catalogue
from worker.engine import parse_stages, run_audit


def profile_one(key: str, device: str, stages: tuple[str, ...], out: Path, top: int) -> dict[str, Any]:
    problem_name, sname = key.split("/", 1)
    problem = load_catalogue().get(problem_name)
    sol = problem.example_solutions()[sname]
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    report = run_audit(problem, sol, device=device, stages=stages, seed=secrets.randbits(62))
    prof.disable()
    wall = time.perf_counter() - t0
    text = io.StringIO()
    for order in ("cumulative", "tottime"):
        text.write(f"===== sorted by {order} =====\n")
        pstats.Stats(prof, stream=text).strip_dirs().sort_stats(order).print_stats(top)
    (out / f"{problem_name}__{sname}.txt").write_text(text.getvalue())
    stages_out = {
        s.name: {"status": s.status.value, "duration_s": s.duration_s, "timings": (s.metrics or {}).get("timings")}
        for s in report.stages
    }
    return {"example": key, "verdict": report.verdict.value, "wall_s": round(wall, 2), "stages": stages_out}


def time_cmd(argv: list[str], env: dict[str, str] | None = None) -> float:
    t = time.perf_counter()
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL)
    return round(time.perf_counter() - t, 3)


def startup(device: str, key: str) -> dict[str, Any]:
    from worker.sandbox import Sandbox
    from worker.sandbox.isolation import namespaces_available

    cuda = device.startswith("cuda")
    code = "import torch" + ("; torch.cuda.init(); torch.empty(1, device='cuda')" if cuda else "")
    res: dict[str, Any] = {
        "python_bare_s": time_cmd([sys.executable, "-c", "pass"]),
        "python_import_torch_s": time_cmd([sys.executable, "-c", "import torch"]),
        "python_import_torch_and_device_s": time_cmd([sys.executable, "-c", code]),
    }
    problem_name, sname = key.split("/", 1)
    sol = load_catalogue().get(problem_name).example_solutions()[sname]
    modes = ["none"] + (["namespaces"] if namespaces_available() else [])
    for iso in modes:
        for rep in range(2):
            sb = Sandbox(device, isolation=iso)  # type: ignore[arg-type]
            t = time.perf_counter()
            sb.start()
            started = time.perf_counter() - t
            t = time.perf_counter()
            sb.load(sol)
            loaded = time.perf_counter() - t
            t = time.perf_counter()
            sb.request("hello", {"device": device})
            hello = time.perf_counter() - t
            sb.close()
            res[f"sandbox_{iso}_{rep}"] = {
                "start_s": round(started, 3),
                "load_s": round(loaded, 3),
                "hello_round_trip_ms": round(hello * 1e3, 2),
            }
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--examples", default="embedding_backward/pytorch_fp32")
    ap.add_argument("--stages", default="intake,static,benchmark,probes,canary")
    ap.add_argument("--top", type=int, default=45)
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-startup", action="store_true")
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    result: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else f"cpu ({os.cpu_count()} cores)",
        "torch": torch.__version__,
        "audits": [],
    }
    stages = parse_stages(args.stages)
    examples = [e.strip() for e in args.examples.split(",") if e.strip()]
    for key in examples:
        row = profile_one(key, args.device, stages, out, args.top)
        print(json.dumps(row), flush=True)
        result["audits"].append(row)
        (out / "profile.json").write_text(json.dumps(result, indent=1))
    if not args.no_startup:
        result["startup"] = startup(args.device, examples[0])
        print(json.dumps(result["startup"]), flush=True)
    (out / "profile.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
