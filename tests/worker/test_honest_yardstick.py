"""The generic probes judge a kernel against what honest implementations achieve (worker.numerics.reorder): fp32
kernels that sum in another order pass, low-precision accumulation still fails."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.reorder_cost import out_of_place
from tests.solution_support import one_file_solution, uploaded_problem
from worker.catalogue import Problem
from worker.engine import run_audit
from worker.numerics.error_metrics import measure_output
from worker.numerics.reorder import Reorder
from worker.problem_spec import OutputBudget
from worker.stages.result import StageStatus

GEMM = {
    "name": "fp32_gemm",
    "description": "out = x @ w.T in fp32",
    "axes": {"m": {"type": "var"}, "k": {"type": "var"}, "n": {"type": "var"}},
    "inputs": {"x": {"shape": ["m", "k"], "dtype": "float32"}, "w": {"shape": ["n", "k"], "dtype": "float32"}},
    "outputs": {"out": {"shape": ["m", "n"], "dtype": "float32"}},
    "reference": "import torch\n\n\ndef run(x, w):\n    return x @ w.t()\n",
}
ROWSUM = {
    "name": "fp32_rowsum",
    "description": "sum of each row, fp32",
    "axes": {"m": {"type": "var"}, "k": {"type": "var"}},
    "inputs": {"x": {"shape": ["m", "k"], "dtype": "float32"}},
    "outputs": {"out": {"shape": ["m"], "dtype": "float32"}},
    "reference": "import torch\n\n\ndef run(x):\n    return x.sum(-1)\n",
}

SPLIT_K = """import torch


def run(x, w):
    parts = [xs @ ws.t() for xs, ws in zip(x.tensor_split(8, dim=1), w.tensor_split(8, dim=1))]
    acc = torch.zeros(x.shape[0], w.shape[0], dtype=torch.float32)
    for p in reversed(parts):  # partials in fp32, added in another order than any BLAS
        acc = acc + p
    return acc
"""
K_LOOP = """import torch


def run(x, w):
    acc = torch.zeros(x.shape[0], w.shape[0], dtype=torch.float32)
    for s in range(0, x.shape[1], 16):  # a naive loop over K tiles, fp32 accumulator
        acc += x[:, s:s + 16] @ w[:, s:s + 16].t()
    return acc
"""
HALF_ACCUMULATOR = """import torch


def run(x, w):
    acc = torch.zeros(x.shape[0], w.shape[0], dtype=torch.bfloat16)
    for s in range(0, x.shape[1], 16):  # the accumulator kept in bf16: the known failure
        acc = (acc.float() + x[:, s:s + 16] @ w[:, s:s + 16].t()).to(torch.bfloat16)
    return acc.float()
"""
SEQUENTIAL_ROWSUM = """import torch


def run(x):
    return x.cumsum(-1)[:, -1].contiguous()  # one running fp32 sum per row, in order
"""
BLOCKED_ROWSUM = """import torch


def run(x):
    blocks = x.reshape(x.shape[0], -1, 4) if x.shape[1] % 4 == 0 else x.unsqueeze(-1)
    return blocks.sum(1).sum(-1)  # four interleaved fp32 partial sums per row, then combined
"""


def _probes(problem: Problem, body: str) -> tuple[StageStatus, str, dict[str, object]]:
    solution = one_file_solution(problem.name, body)
    report = run_audit(problem, solution, stages=["intake", "probes"], seed=3)
    stage = next(s for s in report.stages if s.name == "probes")
    return stage.status, stage.summary, stage.metrics


@pytest.fixture(scope="module")
def gemm(tmp_path_factory: pytest.TempPathFactory) -> Problem:
    return uploaded_problem(
        tmp_path_factory.mktemp("gemm"), GEMM, [{"m": 32, "k": 512, "n": 48}, {"m": 64, "k": 1024, "n": 32}]
    )


@pytest.mark.slow
@pytest.mark.parametrize("body", [SPLIT_K, K_LOOP], ids=["split_k_fp32", "k_loop_fp32"])
def test_an_honest_fp32_gemm_in_another_order_passes(gemm: Problem, body: str) -> None:
    status, summary, metrics = _probes(gemm, body)
    assert status is StageStatus.passed, summary
    # both numbers are in the report: the ideal output's error and the honest implementations'
    outs = [o for p in metrics["probes"].values() if "outputs" in p for o in p["outputs"].values()]
    assert outs and all("honest_rel_err" in o and "ideal_rel_err" in o for o in outs)


@pytest.mark.slow
def test_a_bf16_accumulator_still_fails(gemm: Problem) -> None:
    status, summary, _ = _probes(gemm, HALF_ACCUMULATOR)
    assert status is StageStatus.failed, summary


@pytest.mark.slow
@pytest.mark.parametrize("body", [SEQUENTIAL_ROWSUM, BLOCKED_ROWSUM], ids=["sequential", "blocked"])
def test_an_honest_fp32_reduction_in_any_order_passes(tmp_path: Path, body: str) -> None:
    problem = uploaded_problem(tmp_path, ROWSUM, [{"m": 16, "k": 4096}, {"m": 8, "k": 16384}])
    status, summary, _ = _probes(problem, body)
    assert status is StageStatus.passed, summary


def test_the_honest_yardstick_widens_only_where_honest_orders_err() -> None:
    """The measure alone: against the ideal output, a sequentially summed fp32 row is many times over budget; against
    the honest orderings of the same reduction it is within it. A bf16-accumulated row is not, either way."""
    torch.manual_seed(0)
    x = torch.randn(8, 65536)
    oracle = x.double().sum(-1)
    sequential = torch.zeros(8)
    bf16 = torch.zeros(8, dtype=torch.bfloat16)
    for s in range(0, x.shape[1], 256):  # a naive accumulator over tiles: fp32, and bf16
        sequential = sequential + x[:, s : s + 256].sum(-1)
        bf16 = (bf16.float() + x[:, s : s + 256].sum(-1)).bfloat16()
    bf16 = bf16.float()
    budget = OutputBudget(group_dims=[0], max_ratio=4.0)
    honest = {}
    for style in ("split", "sequential"):
        with Reorder(style):  # type: ignore[arg-type]
            honest[style] = x.sum(-1)
    honest["own"] = x.sum(-1)
    ideal_only = measure_output("out", sequential, oracle, torch.float32, budget)
    with_honest = measure_output("out", sequential, oracle, torch.float32, budget, honest=honest)
    assert not ideal_only.passed and with_honest.passed
    assert with_honest.honest_rel_err is not None and with_honest.honest_rel_err > with_honest.ideal_rel_err
    assert not measure_output("out", bf16, oracle, torch.float32, budget, honest=honest).passed


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "dtype"),
    [
        ((33, 200), (200, 17), torch.bfloat16),  # addmm_
        ((3, 9, 150), (3, 150, 11), torch.float16),  # baddbmm_
        ((2, 3, 9, 64), (64, 5), torch.float32),  # broadcast batch: add_
        ((7, 300), (300,), torch.bfloat16),  # matrix-vector
    ],
)
def test_the_sequential_order_is_the_loop_it_models_bit_for_bit(
    a_shape: tuple[int, ...], b_shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(a_shape, generator=gen).to(dtype)
    b = torch.randn(b_shape, generator=gen).to(dtype)
    with Reorder("sequential") as mode:
        got = torch.matmul(a, b)
    assert mode.rewritten == 1
    assert got.dtype == dtype
    assert torch.equal(got, out_of_place(a, b))  # the loop the style models, one K column at a time
    # with autograd recording (a backward reference), the same values and a gradient
    leaf = a.clone().requires_grad_(True)
    with Reorder("sequential"):
        tracked = torch.matmul(leaf, b)
    assert torch.equal(tracked.detach(), got)
    tracked.float().sum().backward()
    assert leaf.grad is not None and leaf.grad.shape == a.shape
