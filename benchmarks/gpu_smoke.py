"""Quick GPU check of the sandbox path: each Triton example of embedding_backward on one GPU workload.

  python benchmarks/gpu_smoke.py
Prints the normwise error vs the fp64 oracle, and the worst row's error on a Zipf batch.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from worker.catalogue import load_catalogue
from worker.inputs import build_case
from worker.reference import Reference
from worker.sandbox import Sandbox


def main() -> None:
    import triton

    print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0))
    p = load_catalogue().get("embedding_backward")
    ref = Reference.of(p.definition)
    case = build_case(p.definition, ref, p.workloads_gpu[0], 0)
    args = case.args(p.definition)
    n, v = case.axes["num_tokens"], case.axes["vocab_size"]
    ranks = torch.distributions.Categorical(probs=1.0 / torch.arange(1, v + 1).double() ** 1.1).sample((n,))
    zipf_args = [torch.randperm(v)[ranks], args[1] * 1e-3, *args[2:]]
    oracle = p.oracle()
    for name, sol in p.example_solutions().items():
        with Sandbox("cuda") as sb:
            sb.load(sol)
            for label, a in (("uniform", args), ("zipf1.1", zipf_args)):
                rep = sb.request(
                    "call", {"args": a, "outputs": case.output_specs(p.definition), "poison": float("nan")}
                )
                out = rep["outputs"][0].double()
                exact = oracle(*a)[0]
                err = (out - exact).norm() / exact.norm()
                rows = (out - exact).norm(dim=1) / exact.norm(dim=1).clamp_min(1e-30)
                print(f"{name:24s} {label:8s} normwise {err:.2e} worst row {rows[exact.norm(dim=1) > 0].max():.2e}")


if __name__ == "__main__":
    main()
