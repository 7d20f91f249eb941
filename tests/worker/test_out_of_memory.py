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
    """tests/worker/test_trusted_work_placement.py: large work tries the GPU once more first."""
    from worker.numerics.placement import on_device_or_cpu

    seen: list[str] = []

    def work(device: torch.device) -> str:
        seen.append(device.type)
        if device.type == "cuda":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")
        return "done on " + device.type

    assert on_device_or_cpu("cuda:0", work) == "done on cpu" and seen == ["cuda", "cuda", "cpu"]
    seen.clear()
    assert on_device_or_cpu("cpu", work) == "done on cpu" and seen == ["cpu"]


def test_the_drivers_out_of_memory_at_import_is_inconclusive_and_other_driver_errors_fail() -> None:
    """A new CUDA context on a card its neighbours fill raises torch.AcceleratorError('CUDA error: out of memory')
    while the solution imports (seen at eight audits on an 80 GiB H100): the device's load, not the solution's."""
    head = "import torch\n\nraise torch.AcceleratorError({!r})\n\n"
    tail = "def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):\n    pass\n"
    oom = _solution(head.format("CUDA error: out of memory\nSearch for `cudaErrorMemoryAllocation'") + tail)
    report = run_audit(EMB, oom, stages=["intake"], seed=1, isolation="none")
    (intake,) = report.stages[:1]
    assert intake.status is StageStatus.error, intake.summary
    assert "ran out of memory in intake" in intake.summary and intake.metrics["out_of_memory_retries"] == 2
    assert report.verdict.value == "error"

    illegal = _solution(head.format("CUDA error: an illegal memory access was encountered") + tail)
    report = run_audit(EMB, illegal, stages=["intake"], seed=1, isolation="none")
    assert report.stages[0].status is StageStatus.failed, report.stages[0].summary
    assert "does not import" in report.stages[0].summary


def test_only_an_error_that_names_memory_reads_as_out_of_memory() -> None:
    from worker.sandbox.runner import reports_out_of_memory

    assert reports_out_of_memory("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert reports_out_of_memory("torch.AcceleratorError: CUDA error: out of memory\nSearch for ...")
    assert not reports_out_of_memory("AcceleratorError: CUDA error: device-side assert triggered")
    assert not reports_out_of_memory("RuntimeError: CUDA error: out of memory")  # not what torch raises for it
    assert not reports_out_of_memory("AcceleratorError: illegal address\nthe kernel then printed: out of memory")
