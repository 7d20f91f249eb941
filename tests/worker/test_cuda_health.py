"""A process whose CUDA context a device-side assert broke is detected (so a worker replaces it, not reuses it)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

_ASSERT = """
import torch
from worker.numerics.cuda_health import cuda_context_broken
assert not cuda_context_broken()  # before CUDA is used: nothing to break
out = torch.zeros(4, 8, device="cuda")
assert not cuda_context_broken()
try:
    out.index_add_(0, torch.tensor([0, 9], device="cuda"), torch.ones(2, 8, device="cuda"))  # row 9 of 4
    torch.cuda.synchronize()
except Exception as err:
    print("raised", type(err).__name__)
print("broken", cuda_context_broken())
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_device_side_assert_is_detected() -> None:
    done = subprocess.run([sys.executable, "-c", _ASSERT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "broken True" in done.stdout, done.stdout
