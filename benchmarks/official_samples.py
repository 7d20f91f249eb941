"""Audit SOL-ExecBench's own sample solutions, unchanged, with the `kaudit` CLI, and tabulate the verdicts.

  python benchmarks/official_samples.py --root DIR --device cuda --out OUT

DIR holds the sample files as NVIDIA/SOL-ExecBench ships them (they are not committed here: the project writes its
own fixtures). Its layout, as the upstream test folders have it:

  rmsnorm/{definition.json, solution_triton.json, solution_cuda.json}   (tests/samples/rmsnorm)
  other/<sample>/solution_*.json                                        (tests/samples/<sample>)
  evil/evil_timing_bypass/{solution.json, kernel.py}                    (tests/sol_execbench/samples/...)

A workload file for rmsnorm and the evil samples' vecadd problem are written here from what the upstream tests use
(the rmsnorm sample ships none; the evil samples' definition is inline in upstream's end-to-end test). The other
samples' definitions are not in the sample folders; `benchmarks/official_samples/` holds stand-ins written from each
solution's signature, and the table says which definition each audit used.

Writes OUT/official_samples.{json,md} and one traces file per sample; prints the table last.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parent.parent
STAND_INS = Path(__file__).resolve().parent / "official_samples"


class Sample(NamedTuple):
    solution: str  # under --root
    problem: str  # under --root when `official`, else under benchmarks/official_samples
    official: bool  # the definition is SOL-ExecBench's own (or its test's inline one), not a stand-in
    expect: str  # what a SOL-ExecBench user would agree with, and why


SAMPLES = [
    Sample(
        "rmsnorm/solution_triton.json",
        "rmsnorm",
        True,
        "fail: eps 1e-6 where the definition says 1e-5 (matters at small activations); ignores strides",
    ),
    Sample("rmsnorm/solution_cuda.json", "rmsnorm", True, "pass"),
    Sample("evil/evil_timing_bypass/solution_assembled.json", "evil/vecadd", True, "fail: replays after 10 calls"),
    Sample("other/gemma3_swiglu/solution_python.json", "gemma3_swiglu", False, "pass"),
    Sample("other/nemotron_rms_norm/solution_triton.json", "nemotron_rms_norm", False, "pass"),
    Sample("other/olmo3_post_norm/solution_triton.json", "olmo3_post_norm", False, "pass"),
    Sample("other/flux_rope/solution_cuda.json", "flux_rope", False, "pass"),
    Sample(
        "other/jamba_attn_proj/solution_cute_dsl.json",
        "jamba_attn_proj",
        False,
        "pass where CuTe DSL is installed; else error naming the package",
    ),
    Sample(
        "other/jamba_attn_proj/solution_cutile.json",
        "jamba_attn_proj",
        False,
        "error naming the Blackwell requirement on a Hopper GPU",
    ),
]

RMSNORM_WORKLOADS = [
    {
        "uuid": f"rmsnorm-b{b}",
        "axes": {"batch_size": b},
        "inputs": {"hidden_states": {"type": "random"}, "weight": {"type": "random"}},
    }
    for b in (1, 33, 4096)
]
# upstream's end-to-end test: a float32 vecadd over a var axis, two workloads of different sizes
VECADD = {
    "name": "evil_test_vecadd",
    "axes": {"n": {"type": "var"}},
    "inputs": {"x": {"shape": ["n"], "dtype": "float32"}, "y": {"shape": ["n"], "dtype": "float32"}},
    "outputs": {"z": {"shape": ["n"], "dtype": "float32"}},
    "reference": "import torch\ndef run(x, y):\n    return x + y",
}
VECADD_WORKLOADS = [
    {"uuid": f"vecadd-{n}", "axes": {"n": n}, "inputs": {"x": {"type": "random"}, "y": {"type": "random"}}}
    for n in (256, 512)
]


def prepare(root: Path) -> None:
    """The files the upstream samples leave to their tests: workloads, the evil samples' problem and solution."""
    rms = root / "rmsnorm" / "workload.jsonl"
    if not rms.exists():
        rms.write_text("".join(json.dumps(w) + "\n" for w in RMSNORM_WORKLOADS))
    vec = root / "evil" / "vecadd"
    vec.mkdir(parents=True, exist_ok=True)
    (vec / "definition.json").write_text(json.dumps(VECADD, indent=2) + "\n")
    (vec / "workload.jsonl").write_text("".join(json.dumps(w) + "\n" for w in VECADD_WORKLOADS))
    evil = root / "evil" / "evil_timing_bypass"
    if (evil / "solution.json").exists():  # as upstream's test assembles it: kernel.py becomes the one source
        sol = json.loads((evil / "solution.json").read_text())
        sol["sources"] = [{"path": "kernel.py", "content": (evil / "kernel.py").read_text()}]
        (evil / "solution_assembled.json").write_text(json.dumps(sol, indent=2) + "\n")


def audit(root: Path, s: Sample, device: str, stages: str, out: Path, seed: int) -> dict[str, object]:
    problem = (root if s.official else STAND_INS) / s.problem
    traces = out / (s.solution.replace("/", "__").removesuffix(".json") + ".traces.jsonl")
    cmd = [sys.executable, "-m", "app.cli", "audit", str(root / s.solution), "--problem-dir", str(problem)]
    cmd += ["--device", device, "--stages", stages, "--seed", str(seed), "--json", "--traces", str(traces)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    row: dict[str, object] = {
        "solution": s.solution,
        "definition": "official" if s.official else "stand-in",
        "expect": s.expect,
        "exit": proc.returncode,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        row.update(verdict="(no report)", stderr=proc.stderr[-1500:], stdout=proc.stdout[-1500:])
        return row
    row["verdict"] = report.get("verdict")
    row["stages"] = {st["name"]: [st["status"], st["summary"]] for st in report.get("stages", [])}
    # where a sample's time went, and the canary's numbers (the model it trained, gaps, bands, fidelity): a report's
    # summaries alone did not say why an RMSNorm audit took 194 s or what its canary trained
    row["stage_seconds"] = {st["name"]: st.get("duration_s") for st in report.get("stages", [])}
    canary = next((st for st in report.get("stages", []) if st["name"] == "canary"), None)
    if canary is not None:
        row["canary_metrics"] = canary.get("metrics", {})
    if traces.exists():
        row["trace_status"] = [json.loads(line)["evaluation"]["status"] for line in traces.read_text().splitlines()]
    return row


def render(rows: list[dict[str, object]], meta: dict[str, object]) -> str:
    lines = [
        f"# SOL-ExecBench sample solutions, unchanged ({meta['device_name']}, {meta['date']})",
        "",
        f"`{meta['command']}`",
        "",
        "| solution | definition | verdict | benchmark / probes / canary | traces | expected | s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        stages = r.get("stages") or {}
        assert isinstance(stages, dict)
        bp = " / ".join(str(stages.get(n, ["-"])[0]) for n in ("benchmark", "probes", "canary"))
        traces = ", ".join(sorted(set(r.get("trace_status") or [])))  # type: ignore[arg-type]
        lines.append(
            f"| `{r['solution']}` | {r['definition']} | **{r['verdict']}** | {bp} | {traces} | {r['expect']} | "
            f"{r['seconds']} |"
        )
    lines += ["", "First deciding stage's summary per sample:", ""]
    for r in rows:
        stages = r.get("stages") or {}
        assert isinstance(stages, dict)
        verdict = stages.get("verdict", ["", r.get("stderr", "")])[1]
        lines.append(f"- `{r['solution']}`: {str(verdict)[:700]}")
    canaries = [(r["solution"], (r.get("stages") or {}).get("canary")) for r in rows]  # type: ignore[union-attr]
    if any(c for _, c in canaries):
        lines += [
            "",
            "Canary stage per sample (which site the definition matched, how, and the training's outcome):",
            "",
        ]
        lines += [f"- `{sol}`: {c[0]}: {str(c[1])[:900]}" for sol, c in canaries if c]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--stages", default="intake,static,benchmark,probes")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", default="", help="comma-separated substrings of solution paths")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    prepare(args.root)
    chosen = [s for s in SAMPLES if not args.only or any(k in s.solution for k in args.only.split(","))]
    if args.device.startswith("cuda"):
        import torch

        name = torch.cuda.get_device_name(0)
    else:
        name = "CPU"
    meta = {
        "device_name": name,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python", "benchmarks/official_samples.py", *sys.argv[1:]]),
    }
    rows: list[dict[str, object]] = []
    for s in chosen:
        if not (args.root / s.solution).exists():
            rows.append({"solution": s.solution, "definition": "-", "expect": s.expect, "verdict": "(file absent)"})
            continue
        rows.append(audit(args.root, s, args.device, args.stages, args.out, args.seed))
        print(json.dumps({k: rows[-1].get(k) for k in ("solution", "verdict", "seconds")}), flush=True)
        # written after every sample, so a run cut short keeps what finished
        (args.out / "official_samples.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (args.out / "official_samples.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    text = render(rows, meta)
    (args.out / "official_samples.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
