"""Every official SOL-ExecBench language audited on a GPU: the project's own fixtures (tests/fixtures/solexecbench), one
solution per language for one vecadd definition, plus a broken CUDA kernel, a compile error and hostile flags.

    python benchmarks/gpu_languages.py --out DIR [--stages intake,static,benchmark,probes] [--only NAME,...]

Prints one row per solution (verdict, intake summary, compile time, cached or not, benchmark summary) and writes
DIR/gpu_languages.json. Each solution is audited twice: the second build must come from the cache. A language whose
toolchain or DSL package the machine lacks ends `error` naming what to install: that is the expected answer where
the machine has no CUTLASS headers, no cuDNN frontend and no CuTe DSL or cuTile.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "solexecbench"
LANGUAGES = ("pytorch", "triton", "cuda_cpp", "cutlass", "cudnn", "cublas", "cute_dsl", "cutile", "cudnn_frontend")


def _variants(solution: dict) -> dict[str, dict]:  # type: ignore[type-arg]
    """Known-bad CUDA C++ variants of the vecadd fixture: a wrong kernel, a compile error, a hostile flag."""
    import copy

    out = {}
    wrong = copy.deepcopy(solution)
    for s in wrong["sources"]:
        s["content"] = s["content"].replace("a[i] + alpha * b[i]", "a[i] + alpha * b[i] * 1.001f")
    wrong["name"] = "cuda_cpp_wrong_by_0.1pct"
    out[wrong["name"]] = wrong
    broken = copy.deepcopy(solution)
    broken["sources"][0]["content"] = broken["sources"][0]["content"].replace("TORCH_CHECK(", "TORCH_CHEK(", 1)
    broken["name"] = "cuda_cpp_compile_error"
    out[broken["name"]] = broken
    hostile = copy.deepcopy(solution)
    hostile["spec"]["compile_options"] = {"cuda_cflags": ["-O3", "-ccbin=/tmp/evil"], "cflags": [], "ld_flags": []}
    hostile["name"] = "cuda_cpp_hostile_flag"
    out[hostile["name"]] = hostile
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--stages", default="intake,static,benchmark,probes")
    ap.add_argument("--only", default="", help="comma-separated solution names (default: all)")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("gpu_languages.py needs a CUDA GPU")
    from worker.catalogue import load_problem
    from worker.engine import run_audit
    from worker.formats import Solution

    problem = load_problem(FIXTURES)
    # the fixture's safetensors workload names a blob the fixtures do not ship (its "missing input file" is tested)
    problem = dataclasses.replace(
        problem,
        workloads_gpu=tuple(
            w for w in problem.workloads_gpu if not any(i.type == "safetensors" for i in w.inputs.values())
        ),
    )
    raw: dict[str, dict] = {}  # type: ignore[type-arg]
    for lang in LANGUAGES:
        name = "cuda_cpp" if lang == "cuda_cpp" else lang
        raw[name] = json.loads((FIXTURES / f"solution_{lang}.json").read_text())
    raw.update(_variants(raw["cuda_cpp"]))
    rows = []
    args.out.mkdir(parents=True, exist_ok=True)
    env = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d")}
    only = set(filter(None, args.only.split(",")))
    for name, data in raw.items():
        if only and name not in only:
            continue
        solution = Solution.model_validate(data)
        for attempt in (1, 2) if solution.spec.is_cpp else (1,):
            t = time.perf_counter()
            report = run_audit(problem, solution, device="cuda", stages=args.stages.split(","), seed=attempt)
            st = {s.name: s for s in report.stages}
            compile_ev = st["intake"].evidence.get("compile", {})
            rows.append(
                {
                    "solution": name,
                    "attempt": attempt,
                    "languages": list(solution.spec.languages),
                    "verdict": report.verdict.value,
                    "seconds": round(time.perf_counter() - t, 2),
                    "intake": st["intake"].summary,
                    "compile": compile_ev,
                    "benchmark": st["benchmark"].summary if "benchmark" in st else None,
                    "probes": st["probes"].summary if "probes" in st else None,
                    "traces": [
                        t.get("evaluation", {}).get("status") for t in report.stages[-1].evidence.get("traces", [])
                    ],
                }
            )
            r = rows[-1]
            print(
                f"{name:26s} #{attempt} {r['verdict']:5s} {r['seconds']:6.1f}s compile={compile_ev.get('seconds')} "
                f"cached={compile_ev.get('cached')} traces={r['traces']}\n    intake: {r['intake'][:200]}\n"
                f"    benchmark: {(r['benchmark'] or '')[:160]}",
                flush=True,
            )
            # written after every row: a run stopped at its time limit keeps what it measured
            (args.out / "gpu_languages.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
