"""Uploaded test problems and their one-file solutions: a definition written in the test, workloads of random inputs
at the given axes, and a kernel's source inline with entry point `k.py::run`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from worker.catalogue import Problem
from worker.formats import Solution
from worker.formats.bundle import DefinitionBundle
from worker.uploaded import problem_from_bundle


# a bf16 RMSNorm shaped as SOL-ExecBench's own sample (bf16 in and out, fp32 reference), with its epsilon a literal
# in the reference, not an input a probe could move
BF16_RMSNORM = {
    "name": "rmsnorm_h256_eps_literal",
    "op_type": "rmsnorm",
    "axes": {"batch_size": {"type": "var"}, "hidden_size": {"type": "const", "value": 256}},
    "inputs": {
        "hidden_states": {"shape": ["batch_size", "hidden_size"], "dtype": "bfloat16"},
        "weight": {"shape": ["hidden_size"], "dtype": "bfloat16"},
    },
    "outputs": {"output": {"shape": ["batch_size", "hidden_size"], "dtype": "bfloat16"}},
    "reference": (
        "import torch\n\n\ndef run(hidden_states, weight):\n    EPS = 1e-5\n    x = hidden_states.to(torch.float32)\n"
        "    y = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS) * weight.to(torch.float32)\n"
        "    return y.to(hidden_states.dtype)\n"
    ),
}


def uploaded_problem(folder: Path, definition: dict[str, Any], axes: list[dict[str, int]]) -> Problem:
    """`definition` uploaded with one workload per entry of `axes` (every input random), its reference trusted."""
    workloads = [{"uuid": f"w{i}", "axes": a, "inputs": {}} for i, a in enumerate(axes)]
    bundle = DefinitionBundle.model_validate({"definition": definition, "workloads": workloads})
    return problem_from_bundle(bundle, folder / "uploads", trusted_reference=True)


def one_file_solution(definition: str, body: str, *, language: str = "pytorch", dps: bool = False) -> Solution:
    return Solution.model_validate(
        {
            "name": "k",
            "definition": definition,
            "spec": {
                "languages": [language],
                "target_hardware": ["LOCAL"],
                "entry_point": "k.py::run",
                "destination_passing_style": dps,
            },
            "sources": [{"path": "k.py", "content": body}],
        }
    )
