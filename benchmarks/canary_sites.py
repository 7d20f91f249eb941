"""The newer canary sites: each site's correct example must pass and its known-bad one fail.

    python benchmarks/canary_sites.py --out benchmarks/results/canary_sites_cpu [--device cpu|cuda] [--seeds 1]
        [--only linear_forward,...] [--expected pass --lazy-nulls]   # the latter: false-positive repeats

For every (problem, solution) of CASES, the canary stage (the device's profile, nulls always trained so that every row
has its noise band, no parent cache) runs once per seed. One row per run: the site and how it was matched, the stage's
status, each optimiser's paired held-out loss gap (submission - reference), its noise band (the largest null gap)
and limit, and the worst gradient-fidelity ratio (budget 4x). Writes OUT.json after every run and OUT.md at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks.gpu_canary import canary_row
from benchmarks.parallel import run_jobs
from worker.canary.profiles import CanaryProfile, profile_for
from worker.catalogue import load_catalogue

# (problem, solution, expected): per site its known-bad example ("fail") and a correct one ("pass"); "any": a
# known-bad kernel of the catalogue the canary is not required to catch
CASES: list[tuple[str, str, str]] = [
    ("linear_forward", "pytorch_bf16_accumulator", "fail"),
    ("linear_forward", "pytorch_fp32", "pass"),
    ("linear_backward", "pytorch_bf16_split_tokens", "fail"),
    ("linear_backward", "pytorch_fp32", "pass"),
    ("gemm_bias_gelu", "pytorch_bf16_split_k", "any"),
    ("gemm_bias_gelu", "pytorch_fp32", "pass"),
    ("swiglu_gate_up", "pytorch_bf16_accumulator", "fail"),
    ("swiglu_gate_up", "pytorch_fp32", "pass"),
    ("swiglu", "pytorch_exp_ratio_sigmoid", "any"),
    ("swiglu", "pytorch_fp32", "pass"),
    ("geglu", "pytorch_fp32", "pass"),
    ("add_rmsnorm_fp32_residual", "pytorch_bf16_add", "fail"),
    ("add_rmsnorm_fp32_residual", "pytorch_fp32", "pass"),
    ("post_add_rmsnorm", "pytorch_bf16_add", "fail"),
    ("post_add_rmsnorm", "pytorch_fp32", "pass"),
    ("fused_add_rmsnorm", "pytorch_bf16_row_sum", "any"),
    ("fused_add_rmsnorm", "pytorch_fp32", "pass"),
    ("attention_softmax", "pytorch_bf16_row_sum", "fail"),
    ("attention_softmax", "pytorch_fp32", "pass"),
    ("softmax", "pytorch_no_max_subtraction", "any"),
    ("softmax", "pytorch_fp32", "pass"),
    ("rope", "pytorch_bf16_inv_freq", "fail"),
    ("rope", "pytorch_fp32_angles", "any"),
    ("rope", "pytorch_fp64_angles", "pass"),
    ("attention_forward", "pytorch_bf16_accumulator", "fail"),  # on the long window (CanaryProfile.fidelity_context)
    ("attention_forward", "pytorch_fp32", "pass"),
    ("moe_topk_routing", "pytorch_bf16_softmax", "fail"),
    ("moe_topk_routing", "pytorch_ties_high_id", "any"),
    ("moe_topk_routing", "pytorch_stable_sort", "pass"),
    ("layernorm_forward", "pytorch_bf16_sum_of_squares", "any"),  # fails where the model is 256 wide (the GPU's)
    ("layernorm_forward", "pytorch_two_pass", "pass"),
    ("log_softmax", "pytorch_bf16_chunk_sum", "fail"),  # at the loss site
    ("log_softmax", "pytorch_log_of_softmax", "any"),
    ("log_softmax", "pytorch_logsumexp", "pass"),
    ("attention_decode_gqa", "pytorch_bf16_accumulator", "fail"),
    ("attention_decode_gqa", "pytorch_fp32", "pass"),
]


def _pair(row: dict[str, Any], key: str, opt: str) -> float | None:
    v = (row.get(key) or {}).get(opt)
    return float(v) if isinstance(v, (int, float)) else None


def _fmt(x: float | None, signed: bool = False) -> str:
    return "-" if x is None else (f"{x:+.4f}" if signed else f"{x:.4f}")


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| problem / solution | site | expected | status | SGD gap | SGD band | SGD limit | AdamW gap | AdamW band "
        "| AdamW limit | fidelity (x ideal) | s |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        fid = r.get("fidelity_worst_ratio")
        cells = [f"`{r['problem']}/{r['solution']}`", str(r.get("site") or "-"), r["expected"], r["status"]]
        for opt in ("sgd", "adamw"):
            cells += [
                _fmt(_pair(r, "loss_gap", opt), True),
                _fmt(_pair(r, "noise_band", opt)),
                _fmt(_pair(r, "loss_threshold", opt)),
            ]
        cells += ["-" if fid is None else f"{fid:.1f}", f"{r['seconds']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def _machine(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    names = [
        line.split(":", 1)[1].strip()
        for line in Path("/proc/cpuinfo").read_text().splitlines()
        if line.startswith("model name")
    ]
    return f"cpu: {names[0] if names else 'unknown'}, {os.cpu_count()} cores"


# what the header says of the null runs, by the profile's lazy_nulls
NULLS = {
    False: "every null trained",
    True: "the nulls trained only for a gap past the floor (lazy_nulls; a '-' band: none was needed)",
}


def render(env: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    p = env["profile"]
    return (
        f"# The newer canary sites ({env['device']})\n\n`{env['command']}` ({env['date']}, torch {env['torch']}, "
        f"{p['name']} profile with {NULLS[bool(p.get('lazy_nulls'))]}, no parent cache). Gap: mean paired held-out "
        "loss gap over the checkpoints (submission - reference, nats); band: the largest |gap| of the 1-ulp null "
        f"runs; limit: max(3 x band, {p['loss_floor']}); fidelity: the kernel's worst error on the op's real arguments along the "
        "reference's SGD run, as a multiple of the ideal output's (fails above 4).\n\n"
        + "".join(
            f"Rows of {', '.join(r['problems'])} added by `{r['command']}` ({r['date']}).\n\n"
            for r in env.get("added", [])
        )
        + table(rows)
    )


def site_row(
    problem: str, solution: str, expected: str, seed: int, device: str, profile: CanaryProfile
) -> dict[str, Any]:
    """One canary run of one case, as a row (in a worker process of benchmarks.parallel)."""
    row = {**canary_row(load_catalogue().get(problem), solution, seed, device, profile), "expected": expected}
    row.pop("curves_heldout", None)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True, help="path without suffix: OUT.json and OUT.md")
    ap.add_argument("--seeds", type=int, default=1, help="runs per case, seeds FIRST..FIRST+N-1")
    ap.add_argument("--first-seed", type=int, default=1, help="the first seed (to continue a cut run)")
    ap.add_argument("--only", default="", help="comma-separated problem names")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--jobs", type=int, default=1, help="canary runs at once, each in its own process")
    ap.add_argument("--budget-s", type=float, default=float("inf"), help="stop waiting for runs after this long")
    ap.add_argument("--expected", choices=("pass", "fail", "any"), help="only the cases expected to end so")
    ap.add_argument(
        "--lazy-nulls",
        action="store_true",
        help="train the nulls only for a gap over the floor, as an audit does (the verdict is the same; rows whose "
        "gap stays under the floor then have no band)",
    )
    ap.add_argument(
        "--fresh-process",
        action="store_true",
        help="each run in a new process: device memory one run's process still holds grew by about 6 GB a run "
        "on an 80 GB card (2026-12-06) until a later run ran out",
    )
    ap.add_argument(
        "--d-model",
        type=int,
        help="the model's width (the profile's by default: 64 on the CPU, 256 on a GPU), for ops whose error grows "
        "with the width they reduce over, such as a norm's",
    )
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    cases = [c for c in CASES if (not only or c[0] in only) and args.expected in (None, c[2])]
    # by default every row gets its noise band: the nulls are trained whatever the gap; a fresh seed per run, never
    # the parent cache's pool, so that repeats are independent draws
    profile = profile_for("gpu" if args.device == "cuda" else "cpu", lazy_nulls=args.lazy_nulls, seed_pool=None)
    if args.d_model is not None:
        # the parameter limit grows with the width: d_model x (vocabulary for the embedding and head, 12 x d_model a
        # layer), with the CPU profile's 1.5M as the floor
        widened = args.d_model * (2 * profile.vocab_size + 12 * args.d_model * profile.n_layers)
        profile = profile.model_copy(update={"d_model": args.d_model, "max_params": max(profile.max_params, widened)})
    env = {
        "device": _machine(args.device),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python benchmarks/canary_sites.py " + " ".join(sys.argv[1:]),
        "profile": profile.model_dump(mode="json"),
    }
    rows: list[dict[str, Any]] = []
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    order = {(p, s, seed): i for i, (seed, (p, s, _)) in enumerate((seed, c) for seed in seeds for c in cases)}

    def record(row: dict[str, Any]) -> None:
        rows.append(row)
        rows.sort(key=lambda r: order[(r["problem"], r["solution"], r["seed"])])
        print(
            f"{row['problem']}/{row['solution']} seed {row['seed']}: {row['status']} (expected {row['expected']}) "
            f"gap sgd {_fmt(_pair(row, 'loss_gap', 'sgd'), True)} adamw {_fmt(_pair(row, 'loss_gap', 'adamw'), True)} "
            f"fidelity {row.get('fidelity_worst_ratio')} {row['seconds']:.0f} s",
            flush=True,
        )
        args.out.with_suffix(".json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))

    # each run in its own process (benchmarks.parallel), --jobs at once: a canary's verdict does not depend on timing
    run_jobs(
        site_row,
        [(p, s, e, seed, args.device, profile) for seed in seeds for p, s, e in cases],
        workers=args.jobs,
        budget_s=args.budget_s,
        on_result=record,
        tasks_per_process=1 if args.fresh_process else None,
    )
    args.out.with_suffix(".md").write_text(render(env, rows))


if __name__ == "__main__":
    main()
