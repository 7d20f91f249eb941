"""The seed's matrix as a picture: the canary's gradient check per contribution bucket, real text against uniform ids.

    python benchmarks/canary_matrix_plot.py benchmarks/results/h200-2026-12-04/canary_matrix_h200.json \\
        --out docs/canary_matrix_h200.png

Reads the rows `benchmarks/canary_matrix.py` recorded. For each kernel and text, the worst ratio of the kernel's
error to the ideal output's (over the steps checked) in each bucket of rows by how many token contributions the row
sums, one marker per run. A bf16 accumulator's error grows with the contributions a row sums; uniform ids never pile
hundreds on one row, so their hottest bucket is far below the budget while real text's frequent tokens cross it.
The left panel is the fidelity check; the right one each optimiser's paired held-out loss gap against its limit.
Needs matplotlib (`pip install -e '.[bench]'`).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

BUDGET = 4.0


def _bucket_low(bucket: str) -> int | None:
    """The bucket's lowest contribution count ('512-4095' -> 512, '1' -> 1); None for rows with none."""
    m = re.match(r"(\d+)", bucket)
    return int(m.group(1)) if m and int(m.group(1)) > 0 else None


def worst_by_bucket(row: dict[str, Any]) -> dict[int, float]:
    """The worst ratio per bucket over the steps the canary checked."""
    out: dict[int, float] = {}
    for f in row.get("fidelity") or []:
        low = _bucket_low(str(f.get("bucket", "")))
        # a ratio of 0: the kernel and the ideal output agree exactly (one contribution, no rounding to compare)
        if low is not None and f.get("ratio"):
            out[low] = max(out.get(low, 0.0), float(f["ratio"]))
    return out


def label(row: dict[str, Any]) -> str:
    kernel = row["kernel"].split("/", 1)[1]
    return f"{kernel}, {row['text']} text" if row["text"] == "real" else f"{kernel}, uniform ids"


def plot(data: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    env = data["environment"]
    series: dict[str, list[dict[int, float]]] = defaultdict(list)
    gaps: dict[str, list[tuple[float, float, float, float]]] = defaultdict(list)
    for row in data["rows"]:
        series[label(row)].append(worst_by_bucket(row))
        g, lim = row.get("loss_gap") or {}, row.get("loss_threshold") or {}
        if all(isinstance(v, (int, float)) for v in (g.get("sgd"), g.get("adamw"), lim.get("sgd"), lim.get("adamw"))):
            gaps[label(row)].append((g["sgd"], g["adamw"], lim["sgd"], lim["adamw"]))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    kernels = sorted({name.split(",")[0] for name in series})
    palette = dict(zip(kernels, ("tab:red", "tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown")))
    for name in sorted(series):
        kernel = name.split(",")[0]
        for i, run in enumerate(series[name]):
            xs = sorted(run)
            ax.plot(
                xs,
                [run[x] for x in xs],
                "-" if "real" in name else ":",
                marker="o" if "real" in name else "x",
                alpha=0.85,
                color=palette[kernel],
                label=name if i == 0 else None,
            )
    ax.axhline(BUDGET, color="red", linewidth=1)
    ax.text(1, BUDGET * 1.1, f"budget {BUDGET:g}x", color="red")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("token contributions a gradient row sums (bucket's low end)")
    ax.set_ylabel("kernel error / ideal output's error (worst over checked steps)")
    ax.set_title("gradient check on the op's real arguments")
    ax.legend(fontsize=7)
    names = sorted(gaps)
    for j, (opt, col, marker, color) in enumerate((("SGD", 0, "o", "tab:blue"), ("AdamW", 1, "^", "tab:orange"))):
        for i, n in enumerate(names):
            v = [abs(g[col]) for g in gaps[n]]
            bx.scatter(v, [i + (j - 0.5) * 0.25] * len(v), marker=marker, color=color)
        bx.scatter([], [], marker=marker, color=color, label=f"|held-out gap|, {opt}")
    limits = {g[2] for n in names for g in gaps[n]} | {g[3] for n in names for g in gaps[n]}
    for lim in sorted(limits):
        bx.axvline(lim, color="red", linewidth=1)
        bx.text(lim, len(names) - 0.4, f"limit {lim:g}", color="red", ha="right", fontsize=8)
    bx.set_yticks(range(len(names)), names, fontsize=7)
    bx.set_xscale("symlog", linthresh=1e-4)
    bx.set_xlim(left=0)
    bx.set_xlabel("paired held-out loss gap, |submission - reference| (nats)")
    bx.set_title("training: held-out loss")
    bx.legend(fontsize=7, loc="lower right")
    fig.suptitle(
        f"The seed's matrix on {env['device']} ({env['date']}, torch {env['torch']}): "
        "bf16 embedding-gradient accumulators, real text vs uniform ids",
        fontsize=10,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rows", type=Path, help="canary_matrix.json as benchmarks/canary_matrix.py wrote it")
    ap.add_argument("--out", type=Path, required=True, help="PNG")
    args = ap.parse_args()
    plot(json.loads(args.rows.read_text()), args.out)
    print(args.out)


if __name__ == "__main__":
    main()
