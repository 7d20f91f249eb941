"""Which device, and so which queue, audits a solution: its target_hardware against the deployment's devices."""

from __future__ import annotations

from app.core.settings import Settings
from worker.formats import Solution


class NoDeviceForSolution(ValueError):
    """The solution targets hardware this deployment has no workers for."""


def choose_device(solution: Solution, settings: Settings) -> str:
    """A GPU when the solution targets one and the deployment has one, else the CPU; no hardware named: the default.

    A kernel written for both is audited on the GPU, its real target, where the deployment has one.
    """
    kinds, unknown = solution.spec.device_kinds()
    available = settings.devices
    if not solution.spec.target_hardware:
        return settings.device
    if not kinds:
        raise NoDeviceForSolution(
            f"target_hardware {unknown} names no device kernel-audit knows; use 'cpu', 'cuda' or a GPU name such as 'H100'"
        )
    for kind in ("cuda", "cpu"):
        if kind in kinds:
            device = next((d for d in available if d.split(":")[0] == kind), None)
            if device is not None:
                return device
    raise NoDeviceForSolution(
        f"target_hardware {solution.spec.target_hardware} needs {' or '.join(sorted(kinds))}, "
        f"but this deployment audits on {', '.join(available)} only; add 'cpu' to target_hardware if the kernel runs there"
    )
