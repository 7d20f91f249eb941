"""Format dtype names mapped to torch dtypes."""

from __future__ import annotations

import torch

from worker.formats.dtypes import DTYPE_NAMES

_TORCH: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_NAMES}


def to_torch(name: str) -> torch.dtype:
    return _TORCH[name]
