"""Trusted fp64 work (the oracle, the error measurement) that runs out of GPU memory: large work waits for the card
and runs there again before it moves to the host; small work moves to the host at once
(worker.numerics.placement.on_device_or_cpu)."""

from __future__ import annotations

import threading

import pytest
import torch

from worker.numerics.placement import WAIT_FOR_CARD_FROM_BYTES, on_device_or_cpu

LARGE_OOM = (
    "CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 79.18 GiB of which 1.02 GiB is "
    "free. Including non-PyTorch memory, this process has 20.00 GiB memory in use."
)
SMALL_OOM = "CUDA out of memory. Tried to allocate 64.00 MiB. GPU 0 has a total capacity of 79.18 GiB"


def _work(seen: list[str], fails_on_gpu: int, message: str) -> object:
    def work(device: torch.device) -> str:
        seen.append(device.type)
        if device.type == "cuda" and seen.count("cuda") <= fails_on_gpu:
            raise torch.OutOfMemoryError(message)
        return "done on " + device.type

    return work


@pytest.mark.parametrize(
    ("fails_on_gpu", "ends", "places"),
    [(1, "done on cuda", ["cuda", "cuda"]), (2, "done on cpu", ["cuda", "cuda", "cpu"])],
    ids=["runs-on-the-gpu-again-once-its-memory-is-free", "moves-to-the-cpu-after-a-second-try"],
)
def test_large_work_tries_the_gpu_once_more(fails_on_gpu: int, ends: str, places: list[str]) -> None:
    seen: list[str] = []
    assert on_device_or_cpu("cuda:0", _work(seen, fails_on_gpu, LARGE_OOM)) == ends  # type: ignore[arg-type]
    assert seen == places


@pytest.mark.parametrize("message", [SMALL_OOM, "CUDA error: out of memory"])
def test_small_work_or_an_unsized_error_moves_to_the_cpu_at_once(message: str) -> None:
    seen: list[str] = []
    assert on_device_or_cpu("cuda:0", _work(seen, 1, message)) == "done on cpu"  # type: ignore[arg-type]
    assert seen == ["cuda", "cpu"]


def test_the_cpu_runs_the_work_once() -> None:
    seen: list[str] = []
    assert on_device_or_cpu("cpu", _work(seen, 1, LARGE_OOM)) == "done on cpu"  # type: ignore[arg-type]
    assert seen == ["cpu"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_large_work_waits_for_a_neighbour_to_give_its_memory_back() -> None:
    """A neighbour (here a thread of this process) holds most of the card; the work's first try runs out, and it
    runs on the GPU once the neighbour lets go, not on the host."""
    dev = torch.device("cuda:0")
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(dev)
    want = max(WAIT_FOR_CARD_FROM_BYTES, free // 4)
    blocker = [torch.empty(free - want // 2, dtype=torch.uint8, device=dev)]
    tried = threading.Event()

    def neighbour() -> None:
        tried.wait(timeout=60)
        blocker.clear()
        torch.cuda.empty_cache()

    threading.Thread(target=neighbour, daemon=True).start()
    places: list[str] = []

    def work(device: torch.device) -> str:
        places.append(device.type)
        try:
            t = torch.empty(want, dtype=torch.uint8, device=device)
        finally:
            tried.set()
        return t.device.type

    assert on_device_or_cpu(dev, work) == "cuda"
    assert places == ["cuda", "cuda"]
