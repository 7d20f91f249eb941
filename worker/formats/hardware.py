"""`spec.target_hardware` names -> the kinds of device kernel-audit can audit on.

An explicit table, looked up by the whole name (case-insensitive), never by substring: "LOCAL" is
SOL-ExecBench's "whatever this machine is" and so any kind; a GPU model (with or without the NVIDIA_ prefix
SOL-ExecBench's docs use, e.g. NVIDIA_H100) is CUDA; cpu/cuda are kernel-audit's own generic names. A name
that is not in the table is reported as unknown rather than guessed at.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal

DeviceKind = Literal["cpu", "cuda"]
ANY_KIND: Final[frozenset[DeviceKind]] = frozenset({"cpu", "cuda"})
CUDA: Final[frozenset[DeviceKind]] = frozenset({"cuda"})
CPU: Final[frozenset[DeviceKind]] = frozenset({"cpu"})

LOCAL: Final = "LOCAL"

# NVIDIA data-centre and workstation GPUs a kernel is commonly tuned for (SOL-ExecBench's enum has B200)
GPU_MODELS: Final[tuple[str, ...]] = (
    "B200",
    "B100",
    "B300",
    "GB200",
    "GB300",
    "H100",
    "H200",
    "H800",
    "H20",
    "GH200",
    "A100",
    "A800",
    "A40",
    "A30",
    "A10",
    "A10G",
    "L4",
    "L40",
    "L40S",
    "V100",
    "T4",
    "RTX_4090",
    "RTX_5090",
    "RTX_6000_ADA",
    "RTX_PRO_6000",
)

HARDWARE: Final[dict[str, frozenset[DeviceKind]]] = {
    LOCAL: ANY_KIND,
    "CUDA": CUDA,
    "GPU": CUDA,
    "CPU": CPU,
    "X86_64": CPU,
    "AARCH64": CPU,
    "ARM64": CPU,
    **{name: CUDA for name in GPU_MODELS},
    **{f"NVIDIA_{name}": CUDA for name in GPU_MODELS},
}


def kinds_of(name: str) -> frozenset[DeviceKind] | None:
    """The device kinds one target_hardware name stands for; None when the table does not know it."""
    return HARDWARE.get(name.strip().upper())


def device_kinds(names: Iterable[str]) -> tuple[set[DeviceKind], list[str]]:
    """The device kinds a target_hardware list names, and the names the table does not know (in order)."""
    kinds: set[DeviceKind] = set()
    unknown: list[str] = []
    for name in names:
        found = kinds_of(name)
        if found is None:
            unknown.append(name)
        else:
            kinds |= found
    return kinds, unknown
