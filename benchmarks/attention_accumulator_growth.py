"""How a bf16 attention output accumulator's error grows with context length, against the ideal output's.

  python benchmarks/attention_accumulator_growth.py --out benchmarks/results/attention_accumulator_growth_cpu.txt

Why: at the canary's context (64 tokens on the CPU, 256 on the GPU) the catalogue's known-bad attention kernel
(attention_forward/pytorch_bf16_accumulator: a bf16 output accumulator rounded after every 64-key block) stays near the
ideal error (1.6x on an H100), so the canary passes it and only the probes catch it. This measures whether judging the
op's fidelity at a longer context would catch it: the normwise error of the kernel against fp64, as a multiple of the
fp64 result rounded to bf16, as the canary's fidelity check (worker.canary.judge.fidelity) computes it, at growing
lengths. It also measures the same ratio for bf16 attention scores (q @ k^T left in bf16 before an fp32 softmax) at
growing score scales, an attention bug whose error the canary's trained logits set.
The kernels are the catalogue's own, run in this process; inputs are Gaussian (values optionally on an offset).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

import torch

from worker.catalogue import load_catalogue

HEADS, HEAD_DIM, TOKENS = 4, 16, 8192  # batch x length kept at TOKENS


def exact(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    q, k, v = q.double(), k.double(), v.double()
    s = q.shape[-2]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, -1) @ v


def bf16_scores(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    s = q.shape[-2]
    scores = ((q @ k.transpose(-1, -2)) * (1 / math.sqrt(q.shape[-1]))).float()  # rounded to bf16 by the matmul
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(scores, -1) @ v.float()).to(torch.bfloat16)


def ratio(kernel: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> float:
    e = exact(q, k, v)
    out = kernel(q, k, v)
    rel = lambda a: float((a.double() - e).norm() / e.norm())  # noqa: E731
    return rel(out) / rel(e.to(torch.bfloat16))


def catalogue_kernel() -> Callable[..., torch.Tensor]:
    sol = load_catalogue().get("attention_forward").example_solution("pytorch_bf16_accumulator")
    scope: dict[str, object] = {}
    exec(compile(sol.sources[0].content, sol.sources[0].path, "exec"), scope)  # the catalogue's own known-bad file
    run = scope["run"]

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(q)
        run(q, k, v, out)  # type: ignore[operator]
        return out

    return call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(args.seed)

    def draw(length: int, qk_scale: float = 1.0, v_offset: float = 0.0) -> list[torch.Tensor]:
        shape = (max(TOKENS // length, 1), HEADS, length, HEAD_DIM)
        q, k, v = (torch.randn(shape, generator=gen) for _ in range(3))
        return [(q * qk_scale).bfloat16(), (k * qk_scale).bfloat16(), (v + v_offset).bfloat16()]

    acc = catalogue_kernel()
    lines = [
        f"# {Path(__file__).name}, seed {args.seed}, {HEADS} heads of {HEAD_DIM}, {TOKENS} tokens per case (batch x length)",
        "",
    ]
    lines += ["bf16 output accumulator (64-key blocks): error x ideal by context length", ""]
    lines += ["| length | values N(0,1) | values N(2,1) |", "|---:|---:|---:|"]
    for length in (64, 256, 1024, 2048, 4096, 8192):
        r0, r2 = ratio(acc, *draw(length)), ratio(acc, *draw(length, v_offset=2.0))
        lines.append(f"| {length} | {r0:.2f} | {r2:.2f} |")
    lines += ["", "bf16 scores before an fp32 softmax: error x ideal by the std of q and k (score std = scale^2)", ""]
    lines += ["| q, k std | length 64 | length 256 |", "|---:|---:|---:|"]
    for scale in (0.5, 1.0, 2.0, 4.0):
        lines.append(
            f"| {scale} | {ratio(bf16_scores, *draw(64, scale)):.2f} | {ratio(bf16_scores, *draw(256, scale)):.2f} |"
        )
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
