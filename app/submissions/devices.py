"""Which device, and so which queue, audits a solution: its languages and target_hardware against the deployment's
devices. Refused here (an HTTP 422 naming the field) rather than queued for a worker that cannot run it."""

from __future__ import annotations

from collections.abc import Sequence

from app.core.settings import Settings
from worker.formats import Solution, SolutionSpec


class NoDeviceForSolution(ValueError):
    """The solution needs a device this deployment has no workers for; `field` is the part of the spec at fault."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason)
        self.field = field


def _kind(device: str) -> str:
    return device.split(":")[0]


def gpu_language_refusal(spec: SolutionSpec, devices: Sequence[str]) -> str | None:
    """Why `devices` cannot run the solution's languages (some need CUDA and none of them is a GPU); None if they can."""
    need = spec.gpu_languages
    if not need or any(_kind(d) == "cuda" for d in devices):
        return None
    return (
        f"spec.languages {list(spec.languages)}: {', '.join(need)} run only on an NVIDIA GPU (CUDA), but this "
        f"deployment audits on {', '.join(devices)} only; pytorch and triton solutions can be audited here"
    )


def pick_device(spec: SolutionSpec, devices: Sequence[str], default: str) -> str:
    """The device of `devices` to audit on; `default` when the solution names no hardware and its languages allow it.

    A kernel written for both CPU and GPU is audited on the GPU, its real target, where the deployment has one."""
    refusal = gpu_language_refusal(spec, devices)
    if refusal is not None:
        raise NoDeviceForSolution("spec.languages", refusal)
    allowed = {"cuda"} if spec.needs_gpu else {"cpu", "cuda"}
    if spec.target_hardware:
        kinds, unknown = spec.device_kinds()
        if not kinds:
            raise NoDeviceForSolution(
                "spec.target_hardware",
                (
                    f"target_hardware {unknown} names no device kernel-audit knows; use LOCAL (any), a GPU name such "
                    "as B200 or H100, or cpu / cuda"
                ),
            )
        if not kinds & allowed:
            raise NoDeviceForSolution(
                "spec.target_hardware",
                (
                    f"target_hardware {spec.target_hardware} names only the CPU, but spec.languages "
                    f"{spec.gpu_languages} run only on an NVIDIA GPU; name a GPU (or LOCAL)"
                ),
            )
        allowed &= kinds
    elif _kind(default) in allowed:
        return default
    for kind in ("cuda", "cpu"):
        if kind in allowed:
            device = next((d for d in devices if _kind(d) == kind), None)
            if device is not None:
                return device
    raise NoDeviceForSolution(
        "spec.target_hardware",
        (
            f"target_hardware {spec.target_hardware} needs {' or '.join(sorted(allowed))}, "
            f"but this deployment audits on {', '.join(devices)} only; add LOCAL or cpu to target_hardware if the kernel runs there"
        ),
    )


def choose_device(solution: Solution, settings: Settings) -> str:
    """The device (and so the queue) for a submission on this deployment, or NoDeviceForSolution."""
    return pick_device(solution.spec, settings.devices, settings.device)
