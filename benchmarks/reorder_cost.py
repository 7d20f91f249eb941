"""What the honest yardstick's sequential GEMM costs: `Reorder("sequential")` against the out-of-place loop it replaced.

  python benchmarks/reorder_cost.py --device cpu --shapes 1024x1024x2048 --out benchmarks/results/reorder_cost_cpu.json
  python benchmarks/reorder_cost.py --device cuda --shapes 8192x4096x14336,8192x4096x4096 --out reorder_cost_gpu.json

Each shape is MxKxN (bf16 inputs, as the catalogue's GEMM definitions have them). For each: seconds for the
reorder's in-place accumulation (worker.numerics.reorder) and for the loop that rebuilt the output-sized total at
every K step, both sequential over K, and whether the two agree bit for bit. Prints a table; writes JSON to --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from worker.numerics.reorder import Reorder, accumulator


def out_of_place(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The loop the sequential style models, as it was written before: one K column at a time, every step a new
    product (rounded to the accumulator) and a new total. Batched `a`, batched or 1-D `b`, as torch.matmul takes them."""
    out_dtype, acc = torch.result_type(a, b), accumulator(a.dtype, b.dtype)
    a, b = a.to(acc), b.to(acc)

    def col(k: int) -> torch.Tensor:
        return b[k : k + 1] if b.dim() == 1 else b[..., k : k + 1, :]

    total = torch.matmul(a[..., 0:1], col(0))
    for k in range(1, a.shape[-1]):
        total = total + torch.matmul(a[..., k : k + 1], col(k))
    return total.to(out_dtype)


def reordered(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The same GEMM through the honest yardstick's rewrite (worker.numerics.reorder)."""
    with Reorder("sequential"):
        return torch.matmul(a, b)


def timed(fn: Any, device: torch.device, *args: torch.Tensor) -> tuple[torch.Tensor, float]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    out = fn(*args)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shapes", default="1024x1024x2048", help="comma-separated MxKxN")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    device = torch.device(args.device)
    rows = []
    for shape in args.shapes.split(","):
        m, k, n = (int(x) for x in shape.split("x"))
        gen = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(m, k, generator=gen, device=device).to(torch.bfloat16)
        b = torch.randn(k, n, generator=gen, device=device).to(torch.bfloat16)

        new, new_s = timed(reordered, device, a, b)
        old, old_s = timed(out_of_place, device, a, b)
        rows.append(
            {
                "shape": shape,
                "in_place_s": round(new_s, 3),
                "out_of_place_s": round(old_s, 3),
                "speedup": round(old_s / new_s, 2),
                "bit_identical": bool(torch.equal(new, old)),
            }
        )
        print(
            f"{shape}: in place {new_s:.3f} s, out of place {old_s:.3f} s ({old_s / new_s:.1f}x), "
            f"identical {rows[-1]['bit_identical']}",
            flush=True,
        )
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    record = {
        "device": name,
        "torch": torch.__version__,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(sys.argv),
        "rows": rows,
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0 if all(r["bit_identical"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
