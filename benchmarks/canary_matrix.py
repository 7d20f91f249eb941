"""The seed's matrix: does training reveal a bf16 embedding-gradient accumulator on real text and on uniform tokens,
with SGD and with AdamW?

    python benchmarks/canary_matrix.py --device cuda --out DIR [--repeats 2]

For each kernel (the bf16 accumulators and their fp32 counterparts) and each text (the built-in real text, and
i.i.d. uniform token ids over the canary's whole vocabulary: what a benchmark's random workloads look like), the
canary stage runs once per repeat with a fresh seed. One row per run: the stage's status, each optimiser's paired
held-out loss gap (submission - reference) and its noise limit, whether the gap exceeded it, and the gradient
fidelity check. Writes DIR/canary_matrix.json after every run (a run cut short keeps what finished) and prints
the table.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks.gpu_canary import canary_row
from worker.canary.profiles import profile_for
from worker.catalogue import load_catalogue
from worker.probes.token_stats import LoadedTokenStats

KERNELS: dict[str, list[tuple[str, str]]] = {
    "cpu": [("embedding_backward", "pytorch_bf16_accum"), ("embedding_backward", "pytorch_fp32")],
    "cuda": [
        ("embedding_backward", "pytorch_bf16_accum"),
        ("embedding_backward", "triton_bf16_atomic"),
        ("embedding_backward", "pytorch_fp32"),
        ("embedding_backward", "triton_fp32"),
    ],
}
TEXTS = ("real", "uniform")


def uniform_stats(device: str) -> LoadedTokenStats:
    """Equal counts over the canary profile's vocabulary: every id equally likely, no sequence structure."""
    vocab = profile_for("gpu" if device == "cuda" else "cpu").vocab_size
    return LoadedTokenStats(source=f"uniform over {vocab} ids", kind="histogram", values=torch.ones(vocab))


def run_one(problem_name: str, solution_name: str, text: str, seed: int, device: str) -> dict[str, Any]:
    problem = load_catalogue().get(problem_name)
    if text == "uniform":
        problem = problem.with_token_stats(uniform_stats(device))
    return {
        "kernel": f"{problem_name}/{solution_name}",
        "text": text,
        **canary_row(problem, solution_name, seed, device),
    }


def _gap(row: dict[str, Any], opt: str) -> str:
    gap, lim = (row.get("loss_gap") or {}).get(opt), (row.get("loss_threshold") or {}).get(opt)
    if gap is None:
        return "-"
    return f"{gap:+.4f} / {lim:.4f}" if isinstance(lim, (int, float)) else f"{gap:+.4f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--only", default="", help="comma-separated problem/solution names (default: the device's list)")
    args = ap.parse_args()
    kernels = KERNELS[args.device]
    if args.only:
        kernels = [tuple(k.split("/", 1)) for k in args.only.split(",")]  # type: ignore[misc]
    args.out.mkdir(parents=True, exist_ok=True)
    env = {
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    rows: list[dict[str, Any]] = []
    print(
        f"{'kernel':42} {'text':8} {'status':7} {'SGD gap / limit':>20} {'AdamW gap / limit':>20} {'fid x':>8} {'s':>6}"
    )
    for _ in range(args.repeats):
        for problem_name, solution_name in kernels:
            for text in TEXTS:
                r = run_one(problem_name, solution_name, text, secrets.randbits(62), args.device)
                rows.append(r)
                fid = r["fidelity_worst_ratio"]
                print(
                    f"{r['kernel']:42} {text:8} {r['status']:7} {_gap(r, 'sgd'):>20} {_gap(r, 'adamw'):>20} "
                    f"{fid if fid is None else round(fid, 1)!s:>8} {r['seconds']:6.1f}",
                    flush=True,
                )
                (args.out / "canary_matrix.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
