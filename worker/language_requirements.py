"""What a language needs from the GPU and its toolchain beyond its Python package.

Checked at intake, so a kernel that cannot run on this worker ends `error` (inconclusive: the worker, not the
kernel, falls short) with the requirement named, instead of `fail` at its first call with a compiler's message.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final, NamedTuple

from worker.formats.languages import Language


class DeviceFacts(NamedTuple):
    name: str
    capability: tuple[int, int]


class GpuRequirement(NamedTuple):
    capability_majors: frozenset[int]  # the compute capabilities (major) the language generates code for
    gpus: str  # those capabilities in words, for the message
    tool: str  # the executable it compiles with at run time
    toolkit: str  # where that executable comes from


# cuTile Python (cuda-tile 1.1, the `gpu` extra's pin) compiles through Tile IR with CUDA 13.1's `tileiras` and
# generates code for Blackwell only (its documented prerequisites: compute capability 10.x or 12.x, toolkit 13.1+)
REQUIREMENTS: Final[dict[Language, GpuRequirement]] = {
    "cutile": GpuRequirement(
        frozenset({10, 12}),
        "a Blackwell GPU (compute capability 10.x or 12.x)",
        "tileiras",
        "the CUDA Toolkit 13.1 or newer (on PATH or in $CUDA_HOME/bin), or pip install 'cuda-tile[tileiras]'",
    ),
}


def find_tool(name: str) -> str | None:
    """Where the executable is: PATH first, then the toolkit folder, the way cuTile itself looks for tileiras."""
    found = shutil.which(name)
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / name).is_file():
            return str(Path(home) / "bin" / name)
    return None


def unmet_requirements(
    languages: Iterable[Language], device: DeviceFacts, locate: Callable[[str], str | None] = find_tool
) -> list[str]:
    """For each language this device or its toolchain cannot run: what it needs, and what this worker has."""
    out: list[str] = []
    major, minor = device.capability
    for lang in languages:
        req = REQUIREMENTS.get(lang)
        if req is None:
            continue
        if major not in req.capability_majors:
            out.append(
                f"{lang} needs {req.gpus}; this worker's GPU is {device.name} (compute capability "
                f"{major}.{minor}): audit it on a worker with such a GPU"
            )
        elif locate(req.tool) is None:
            out.append(f"{lang} compiles with '{req.tool}', which this worker does not have: install {req.toolkit}")
    return out


def device_facts(device: str) -> DeviceFacts:
    import torch

    dev = torch.device(device)
    major, minor = torch.cuda.get_device_capability(dev)
    return DeviceFacts(str(torch.cuda.get_device_name(dev)), (int(major), int(minor)))
