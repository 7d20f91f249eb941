"""Routing a submission to a device by its target_hardware and the deployment's devices."""

from __future__ import annotations

import pytest

from app.core.settings import Settings
from app.submissions.devices import NoDeviceForSolution, choose_device
from worker.formats import Solution


def _sol(hw: list[str]) -> Solution:
    return Solution.model_validate({
        "name": "k", "definition": "embedding_backward",
        "spec": {"language": "triton", "target_hardware": hw, "entry_point": "k.py::run"},
        "sources": [{"path": "k.py", "content": "def run(): pass\n"}],
    })


@pytest.mark.parametrize(
    "hw, kinds, unknown",
    [
        (["cuda"], {"cuda"}, []),
        (["H100", "B200"], {"cuda"}, []),
        (["NVIDIA_H200"], {"cuda"}, []),
        (["cpu", "cuda"], {"cpu", "cuda"}, []),
        (["x86_64"], {"cpu"}, []),
        (["TPUv5"], set(), ["TPUv5"]),
    ],
)
def test_target_hardware_names_map_to_device_kinds(hw: list[str], kinds: set[str], unknown: list[str]) -> None:
    assert _sol(hw).spec.device_kinds() == (kinds, unknown)


def test_a_gpu_kernel_goes_to_the_gpu_when_the_deployment_has_one() -> None:
    both = Settings(audit_devices="cpu,cuda")
    assert choose_device(_sol(["cuda"]), both) == "cuda"
    assert choose_device(_sol(["cpu", "cuda"]), both) == "cuda"  # its real target
    assert choose_device(_sol(["cpu"]), both) == "cpu"
    assert choose_device(_sol([]), both) == "cpu"  # names none: the deployment's default
    assert both.queue_for("cuda").endswith("gpu") and both.queue_for("cpu").endswith("cpu")


def test_a_cpu_only_deployment_takes_portable_kernels_and_refuses_gpu_only_ones() -> None:
    cpu = Settings()
    assert cpu.devices == ["cpu"]
    assert choose_device(_sol(["cpu", "cuda"]), cpu) == "cpu"
    with pytest.raises(NoDeviceForSolution, match=r"needs cuda, but this deployment audits on cpu only"):
        choose_device(_sol(["H100"]), cpu)
    with pytest.raises(NoDeviceForSolution, match="names no device"):
        choose_device(_sol(["TPUv5"]), cpu)


def test_a_gpu_only_deployment_refuses_cpu_only_kernels() -> None:
    gpu = Settings(device="cuda", audit_devices="cuda")
    assert choose_device(_sol([]), gpu) == "cuda"
    with pytest.raises(NoDeviceForSolution, match="needs cpu"):
        choose_device(_sol(["cpu"]), gpu)
