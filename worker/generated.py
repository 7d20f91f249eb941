"""Random inputs made from a seed on either side of the trust boundary, instead of shipped across it.

A benchmark input of kind "random" is a `Generated` recipe: seed, shape and dtype. On a GPU the trusted
parent and the sandbox child each make it on the device from the recipe (torch's Philox generator: the
same seed, shape and dtype on the same card and torch build give the same bits), so a 1 GiB logits tensor
costs a millisecond on each side instead of a host round trip through files. Nothing is trusted to the
child: the parent judges the kernel's outputs against the reference on its own copy, and the child
reports a digest of what it made, so a child whose inputs differ (a different build, or a forger) is
caught before any output is judged. A digest of the inputs after the call stands in for the copy the
parent would otherwise read back to see whether the kernel wrote into its inputs.

Used only by the trusted process (worker.inputs, worker.stages.benchmark) and the child's harness.
"""

from __future__ import annotations

from typing import Any

import torch

WIRE_KEY = "__generated__"
DIGEST_KEY = "__digest__"
_INT_BY_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_DIGEST_MODULUS = 1_000_003  # position weights cycle with this period: a permutation changes the digest
_DIGEST_CHUNK = 1 << 24


def make(seed: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """The tensor a recipe stands for: standard normal floats (drawn in fp32, then rounded to `dtype`),
    integers uniform in [0, 128), or fair booleans."""
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(int(seed))
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen, dtype=torch.float32, device=device).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen, device=device).bool()
    return torch.randint(0, 128, shape, generator=gen, dtype=torch.int64, device=device).to(dtype)


def wire(seed: int, shape: tuple[int, ...], dtype: torch.dtype) -> dict[str, Any]:
    """The recipe as it travels in a request's `args` (plain data)."""
    return {WIRE_KEY: {"seed": int(seed), "shape": [int(s) for s in shape], "dtype": str(dtype).removeprefix("torch.")}}


def is_wire(value: object) -> bool:
    return isinstance(value, dict) and set(value) == {WIRE_KEY}


def from_wire(value: dict[str, Any], device: torch.device | str) -> torch.Tensor:
    """The child's side: make the tensor a wire recipe describes (bad recipes raise ValueError)."""
    spec = value[WIRE_KEY]
    dtype = getattr(torch, str(spec.get("dtype", "")), None)
    shape = spec.get("shape")
    if (
        not isinstance(dtype, torch.dtype)
        or not isinstance(shape, list)
        or not all(isinstance(s, int) and s >= 0 for s in shape)
    ):
        raise ValueError(f"malformed input recipe: {spec!r}")
    return make(int(spec["seed"]), tuple(shape), dtype, device)


def digest(t: torch.Tensor) -> int:
    """A position-weighted sum of the tensor's bits (on its own device): equal tensors give equal digests, and
    a changed or moved element changes it (short of a collision nobody but a forger would arrange, and a forger
    gains nothing by it: outputs are judged on the parent's own copy)."""
    flat = t.detach().contiguous().reshape(-1)
    bits = flat.view(_INT_BY_SIZE[flat.element_size()]) if flat.numel() else flat
    total = 0
    for start in range(0, bits.numel(), _DIGEST_CHUNK):  # in chunks: a 1 GiB input needs no 8 GiB of int64
        chunk = bits[start : start + _DIGEST_CHUNK].to(torch.int64)
        weights = (
            torch.arange(start, start + chunk.numel(), device=chunk.device, dtype=torch.int64) % _DIGEST_MODULUS + 1
        )
        total = (total + int((chunk * weights).sum())) % (1 << 61)
    return total ^ hash(tuple(t.shape))


def digest_wire(t: torch.Tensor) -> dict[str, int]:
    return {DIGEST_KEY: digest(t)}


def is_digest(value: object) -> bool:
    return isinstance(value, dict) and set(value) == {DIGEST_KEY} and isinstance(value[DIGEST_KEY], int)
