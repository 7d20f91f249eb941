"""A Triton kernel that computes in bf16 cannot be judged on a CPU worker: Triton's interpreter does bf16 arithmetic
on the raw bits (worker.sandbox.interpreter_bf16). Its audit there is inconclusive, naming why, not a `fail`; a
kernel that converts to fp32 first is judged as usual, right or wrong.

The three kernels below are run in the real sandbox under the real interpreter, on a definition of the same shape as
SOL-ExecBench's own sample RMSNorm (bf16 in and out, fp32 reference)."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from tests.solution_support import BF16_RMSNORM, one_file_solution, uploaded_problem
from worker.catalogue import Problem
from worker.engine import run_audit
from worker.report import AuditReport
from worker.stages import verdict
from worker.report import WORKER_LIMIT
from worker.sandbox import Sandbox
from worker.sandbox.interpreter_bf16 import round_to_bf16
from worker.stages.result import StageResult, StageStatus

pytest.importorskip("triton")


_KERNEL = """import triton
import triton.language as tl


@triton.jit
def _rms(x_ptr, w_ptr, y_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n + cols){to_x}
    w = tl.load(w_ptr + cols){to_w}
    rms = tl.sqrt(tl.sum(x * x, axis=0) / n + {eps})
    tl.store(y_ptr + row * n + cols, (x / rms * w).to(tl.bfloat16))


def run(x, weight, y):
    _rms[(x.shape[0],)](x, weight, y, x.shape[1], BLOCK=x.shape[1])
"""
FP32 = {"to_x": ".to(tl.float32)", "to_w": ".to(tl.float32)"}
# every product, sum and quotient in bf16, as SOL-ExecBench's sample RMSNorm computes: right on a GPU
BF16_MATH = _KERNEL.format(to_x="", to_w="", eps="1e-5")
FP32_MATH = _KERNEL.format(**FP32, eps="1e-5")
# computes in fp32, with an epsilon 1e4 times the definition's: wrong at every activation scale the benchmark draws
FP32_WRONG_EPS = _KERNEL.format(**FP32, eps="0.1")


@pytest.fixture(scope="module")
def problem(tmp_path_factory: pytest.TempPathFactory) -> Problem:
    return uploaded_problem(tmp_path_factory.mktemp("up"), BF16_RMSNORM, [{"batch_size": 3}, {"batch_size": 16}])


def _audit(problem: Problem, body: str, stages: list[str]) -> AuditReport:
    solution = one_file_solution(problem.name, body, language="triton", dps=True)
    return run_audit(problem, solution, stages=stages, seed=11)


def _stage(report: AuditReport, name: str) -> StageResult:
    return next(s for s in report.stages if s.name == name)


def test_bf16_arithmetic_under_the_interpreter_is_inconclusive_not_failed(problem: Problem) -> None:
    report = _audit(problem, BF16_MATH, ["intake", "benchmark", "probes"])
    bench, probes, judged = _stage(report, "benchmark"), _stage(report, "probes"), _stage(report, "verdict")
    for stage in (bench, probes):
        assert stage.status is StageStatus.error, stage.summary
        assert "bf16 arithmetic in Triton" in stage.summary and "GPU worker" in stage.summary
        assert stage.evidence["interpreter_bf16"] in ("binary_op", "reduce", "unary_op")
        assert WORKER_LIMIT in stage.evidence
    # what the interpreter made of it is kept: the comparison that would have failed the kernel
    assert bench.evidence["comparison_on_this_worker"]["ok"] is False
    assert judged.metrics["verdict"] == "error" and judged.metrics["caught_by"] == []
    # retrying on this worker cannot help, and the verdict says so instead of "retry"
    assert judged.metrics["retry"] is False and "a retry here would not" in judged.summary


def test_a_kernel_that_computes_in_fp32_is_judged_on_the_cpu(problem: Problem) -> None:
    right = _audit(problem, FP32_MATH, ["intake", "benchmark"])
    assert _stage(right, "benchmark").status is StageStatus.passed, _stage(right, "benchmark").summary
    assert "interpreter_bf16" not in _stage(right, "benchmark").evidence
    # wrong in fp32 is wrong: the watch excuses only bf16 arithmetic, so this stays a failure
    wrong = _audit(problem, FP32_WRONG_EPS, ["intake", "benchmark"])
    bench = _stage(wrong, "benchmark")
    assert bench.status is StageStatus.failed, bench.summary
    assert "interpreter_bf16" not in bench.evidence and WORKER_LIMIT not in bench.evidence
    assert _stage(wrong, "verdict").metrics["verdict"] == "fail"


def test_only_an_error_that_names_the_workers_limit_drops_the_retry_advice() -> None:
    transient = StageResult(name="benchmark", status=StageStatus.error, summary="the sandbox died")
    limited = transient.model_copy(update={"evidence": {WORKER_LIMIT: "needs a Blackwell GPU"}})
    assert verdict.judge([transient]).metrics["retry"] is True
    judged = verdict.judge([limited])
    assert judged.metrics["retry"] is False and "retry the audit" not in judged.summary


ROUND = """import triton
import triton.language as tl


@triton.jit
def _to_bf16(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask).to(tl.bfloat16), mask=mask)


def run(x, y):
    _to_bf16[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
"""


def test_fp32_to_bf16_rounds_to_nearest_even_under_the_interpreter_as_on_a_gpu() -> None:
    # values half an ulp of bf16 above a representable one, and random ones over fp32's range: the interpreter alone
    # truncates all of them (doubling a bf16 output's error), the GPU and torch round to nearest even
    ulp = 2.0**-8
    ties = torch.tensor([1 + ulp / 2, 1 + 3 * ulp / 2, -(1 + 3 * ulp / 2), 1 + ulp / 2 + 2**-20, 3.0e38, 1e-40])
    x = torch.cat([ties, torch.randn(5000) * torch.logspace(-30, 30, 5000)])
    with Sandbox("cpu") as sb:
        sb.load(one_file_solution("k", ROUND, language="triton", dps=True))
        reply = sb.request("call", {"args": [x], "outputs": [{"shape": [x.numel()], "dtype": "bfloat16"}]})
    (y,) = reply["outputs"]
    assert torch.equal(y.view(torch.int16), x.to(torch.bfloat16).view(torch.int16))
    assert reply["interpreter_bf16"] is None  # a conversion is not bf16 arithmetic


def test_the_rounding_keeps_a_scalars_shape_and_reads_strided_values() -> None:
    scalar = np.array(1 + 2.0**-8 + 2.0**-12, dtype=np.float32)  # just above a tie: rounds up
    assert round_to_bf16(scalar).shape == ()
    assert int(round_to_bf16(scalar)) == torch.tensor(float(scalar)).to(torch.bfloat16).view(torch.int16).item()
    strided = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)[:, ::2]
    want = torch.from_numpy(np.ascontiguousarray(strided)).to(torch.bfloat16).view(torch.int16).numpy()
    assert (round_to_bf16(strided) == want.view(np.uint16)).all()
