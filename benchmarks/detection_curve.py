"""Detection curve: the fewest contributions to one embedding row at which the probes flag a bf16 accumulator.

  python benchmarks/detection_curve.py --out benchmarks/results/detection_curve_cpu.json --plot docs/detection_curve_cpu.png
  python benchmarks/detection_curve.py --device cuda --solution triton_bf16_atomic \\
      --out detection_curve_h200.json --plot detection_curve_h200.png

One hot id takes k of the batch's tokens (k = 8 .. 4096, doubling); every other token is a uniform id
over a large vocabulary, so other rows sum about one contribution. Each k runs as a probe of the
embedding_backward probes stage (curated budget: 4x the ideal output's error per row) with `--repeats`
fresh seeds. The hottest row's error ratio and the probe's verdict are recorded; the detection point is
the smallest k from which every repeat, at that k and every larger one, is flagged.
The plot needs matplotlib (`pip install -e '.[bench]'`).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import secrets
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.audit_examples import device_name
from worker.catalogue import load_catalogue
from worker.context import AuditContext
from worker.problem_spec import InputGenerator, ProbeSpec
from worker.stages import probes as probes_stage

SIZES = {
    "cpu": {"num_tokens": 8192, "vocab_size": 32000, "hidden_size": 64},
    "cuda": {"num_tokens": 16384, "vocab_size": 32000, "hidden_size": 1024},
}


def probe_for(k: int, axes: dict[str, int], grad: str) -> ProbeSpec:
    n = axes["num_tokens"]
    grad_gen = (
        InputGenerator(kind="shared_direction", ids_from="indices", std=1e-3)
        if grad == "shared_direction"
        else InputGenerator(kind="normal", std=1e-3)
    )
    return ProbeSpec(
        name=f"hot_k{k}",
        why=f"one id takes {k} of {n} tokens",
        axes=axes,
        gpu_axes=axes,
        inputs={
            "indices": InputGenerator(kind="hot_id", fraction=k / n, high_axis="vocab_size"),
            "grad_output": grad_gen,
            "num_embeddings": InputGenerator(kind="from_axis", axis="vocab_size"),
            "padding_idx": InputGenerator(kind="scalar", value=-1),
        },
    )


def hot_row(metrics: dict[str, Any]) -> dict[str, Any]:
    out = metrics["outputs"]["grad_weight"]
    top = next((b for b in reversed(out["buckets"]) if b["groups"] > 0), None)
    return {
        "worst_ratio": out["worst_ratio"],
        "worst_group_label": out["worst_group_label"],
        "top_bucket": top["label"] if top else None,
        "top_bucket_ratio": top["ratio"] if top else None,
    }


def run_curve(device: str, solution: str, ks: list[int], repeats: int, grad: str) -> list[dict[str, Any]]:
    problem = load_catalogue().get("embedding_backward")
    axes = SIZES["cuda" if device.startswith("cuda") else "cpu"]
    spec = problem.spec.model_copy(update={"probes": [probe_for(k, axes, grad) for k in ks], "jitter_axes": False})
    rows = []
    for r in range(repeats):
        seed = secrets.randbits(62)
        ctx = AuditContext(
            problem=dataclasses.replace(problem, spec=spec),
            solution=problem.example_solution(solution),
            device=device,
            seed=seed,
        )
        try:
            result = probes_stage.run(ctx)
        finally:
            ctx.close()
        for k in ks:
            m = result.metrics["probes"][f"hot_k{k}"]
            rows.append({"k": k, "repeat": r, "seed": seed, "flagged": not m["passed"], **hot_row(m)})
            print(
                f"repeat {r} k={k}: ratio {m['worst_ratio']:.2f}x, {'FLAGGED' if not m['passed'] else 'passes'}",
                flush=True,
            )
    return rows


def detection_point(rows: list[dict[str, Any]], ks: list[int]) -> int | None:
    flagged_all = {k: all(r["flagged"] for r in rows if r["k"] == k) for k in ks}
    for i, k in enumerate(ks):
        if all(flagged_all[j] for j in ks[i:]):
            return k
    return None


def plot(rows: list[dict[str, Any]], ks: list[int], budget: float, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for r in sorted({row["repeat"] for row in rows}):
        pts = [(row["k"], row["worst_ratio"]) for row in rows if row["repeat"] == r]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", alpha=0.7, label=f"seed {r + 1}")
    ax.axhline(budget, color="red", linestyle="--", label=f"budget {budget:g}x")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ks)
    ax.set_xticklabels([str(k) for k in ks], rotation=45)
    ax.set_xlabel("contributions to the hottest row (k)")
    ax.set_ylabel("worst row error / ideal output's error")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--solution", default=None, help="default: pytorch_bf16_accum on the CPU, triton_bf16_atomic on CUDA"
    )
    ap.add_argument("--kmin", type=int, default=8)
    ap.add_argument("--kmax", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--grad",
        choices=["normal", "shared_direction"],
        default="normal",
        help="gradient rows: zero-mean noise (the conservative case) or one direction per token",
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--plot", type=Path, default=None)
    args = ap.parse_args()
    solution = args.solution or ("triton_bf16_atomic" if args.device.startswith("cuda") else "pytorch_bf16_accum")
    ks = []
    k = args.kmin
    while k <= args.kmax:
        ks.append(k)
        k *= 2
    import torch

    rows = run_curve(args.device, solution, ks, args.repeats, args.grad)
    budget = load_catalogue().get("embedding_backward").spec.budgets["grad_weight"].max_ratio
    point = detection_point(rows, ks)
    result = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "device": args.device,
        "device_name": device_name(args.device),
        "torch": torch.__version__,
        "solution": f"embedding_backward/{solution}",
        "axes": SIZES["cuda" if args.device.startswith("cuda") else "cpu"],
        "grad": args.grad,
        "budget": budget,
        "repeats": args.repeats,
        "detected_from_k": point,
        "rule": "smallest k from which every repeat at that k and every larger k is flagged by the probe",
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"detected from k = {point} ({args.repeats} repeats); written {args.out}")
    if args.plot is not None:
        plot(rows, ks, budget, f"{solution} on {result['device_name']}: flagged from k = {point}", args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
