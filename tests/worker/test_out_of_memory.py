"""The device running out of memory in the submission's process is inconclusive, never a kernel failure: on a GPU
shared by several audits it is as often the auditor's load (measured on the H200, 2026-12-02: three correct kernels
were failed this way with six audits at once) as the kernel's appetite."""

from __future__ import annotations

import torch

from worker.catalogue import load_catalogue
from worker.engine import run_audit
from worker.formats import Solution, SolutionSpec, SourceFile
from worker.stages.result import StageStatus

EMB = load_catalogue().get("embedding_backward")


def _solution(body: str) -> Solution:
    return Solution(
        name="inline",
        definition=EMB.name,
        spec=SolutionSpec(language="python", entry_point="kernel.py::run", destination_passing_style=True),
        sources=[SourceFile(path="kernel.py", content=body)],
    )


def test_out_of_memory_in_the_kernel_makes_the_stage_inconclusive_not_failed() -> None:
    body = """
import torch

def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 128.00 MiB.")
"""
    report = run_audit(EMB, _solution(body), stages=["intake", "benchmark", "probes"], seed=1, isolation="none")
    by = {s.name: s for s in report.stages}
    assert by["benchmark"].status is StageStatus.error, by["benchmark"].summary
    assert "ran out of memory" in by["benchmark"].summary
    assert by["benchmark"].metrics["out_of_memory_retries"] == 2  # waited for memory and ran again, twice
    assert report.verdict.value != "pass"


def test_any_other_exception_in_the_kernel_still_fails() -> None:
    body = """
def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    raise RuntimeError("boom")
"""
    report = run_audit(EMB, _solution(body), stages=["intake", "benchmark"], seed=1, isolation="none")
    by = {s.name: s for s in report.stages}
    assert by["benchmark"].status is StageStatus.failed, by["benchmark"].summary


def test_trusted_work_that_runs_out_of_gpu_memory_moves_to_the_cpu() -> None:
    from worker.numerics.placement import on_device_or_cpu

    seen: list[str] = []

    def work(device: torch.device) -> str:
        seen.append(device.type)
        if device.type == "cuda":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")
        return "done on " + device.type

    assert on_device_or_cpu("cuda:0", work) == "done on cpu" and seen == ["cuda", "cpu"]
    seen.clear()
    assert on_device_or_cpu("cpu", work) == "done on cpu" and seen == ["cpu"]
