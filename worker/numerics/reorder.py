"""The reference re-run with its reductions summed in another honest order: the yardstick an honest kernel meets.

No fp32 kernel can reach the correctly rounded result of a long reduction, and neither can the reference: a split-K
GEMM, a blocked row sum or a sequential loop each round differently, and each is correct. Judging a kernel against the
ideal output's error alone (the fp64 result rounded once) flags honest kernels that merely sum in another order. So
the generic probes also measure what honest implementations achieve (worker.stages.probes): the reference at its
own dtypes, and the reference under `Reorder`, which rewrites its sums, means and matrix products:
  - "split": the reduction split in two halves, each summed on its own, the halves added (split-K, two CTAs);
  - "sequential": one running sum in order, element after element (a thread looping over its row, a loop over K).
Every partial is kept at the accumulator precision an honest kernel uses: fp32 for fp16/bf16 inputs, the input's
own otherwise. A kernel that accumulates in bf16 or fp16 is not honest by this measure and still fails.

Other reductions inside the reference (softmax, norms, variance) run as torch runs them: their own order is covered
by the reference at its own precision.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

Style = Literal["split", "sequential"]
STYLES: tuple[Style, ...] = ("split", "sequential")
# "sequential" adds one element (or one K column) at a time, as one thread looping over a row does, up to this many
# steps; a longer reduction takes tiles of n / MAX_SEQUENTIAL_STEPS, so the re-run stays cheap
MAX_SEQUENTIAL_STEPS = 8192
_LOW = (torch.float16, torch.bfloat16)

_SUMS = {torch.sum, torch.Tensor.sum}
_MEANS = {torch.mean, torch.Tensor.mean}
_MATMULS = {
    torch.matmul,
    torch.Tensor.matmul,
    torch.Tensor.__matmul__,
    torch.mm,
    torch.Tensor.mm,
    torch.bmm,
    torch.Tensor.bmm,
}
_LINEAR = {F.linear}


def accumulator(*dtypes: torch.dtype) -> torch.dtype:
    """The precision an honest kernel accumulates in: fp32 for half types, the widest input's otherwise."""
    widest = max(dtypes, key=lambda d: torch.finfo(d).bits)
    return torch.float32 if widest in _LOW else widest


def _sum_last(x: torch.Tensor, style: Style, acc: torch.dtype) -> torch.Tensor:
    """Sum over the last dim of `x` in `style`, at `acc`."""
    x = x.to(acc)
    n = x.shape[-1]
    if n < 2:
        return x.sum(-1)
    if style == "split":
        first, second = x.tensor_split(2, dim=-1)
        return second.sum(-1) + first.sum(-1)
    # a running sum over tiles, in order (not cumsum: on the CPU it accumulates fp32 in fp64)
    chunk = max(1, -(-n // MAX_SEQUENTIAL_STEPS))
    total = x[..., :chunk].sum(-1)
    for lo in range(chunk, n, chunk):
        total = total + x[..., lo : lo + chunk].sum(-1)
    return total


def _reduce(
    x: torch.Tensor, dim: Any, keepdim: bool, dtype: torch.dtype | None, style: Style, mean: bool
) -> torch.Tensor:
    nd = x.dim()
    dims = (
        list(range(nd))
        if dim is None or (isinstance(dim, Sequence) and len(dim) == 0)
        else ([dim] if isinstance(dim, int) else list(dim))
    )
    dims = sorted({d % nd for d in dims}) if nd else []
    keep = [d for d in range(nd) if d not in dims]
    n = math.prod(x.shape[d] for d in dims) if dims else 1
    moved = x.permute(*keep, *dims).reshape(*[x.shape[d] for d in keep], n) if nd else x.reshape(1)
    out_dtype = dtype or x.dtype
    total = _sum_last(moved, style, accumulator(x.dtype, out_dtype))
    if mean:
        total = total / n
    if keepdim:
        total = total.reshape([1 if d in dims else x.shape[d] for d in range(nd)])
    return total.to(out_dtype)


def _k_slice(b: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    return b[lo:hi] if b.dim() == 1 else b[..., lo:hi, :]


def _matmul(a: torch.Tensor, b: torch.Tensor, style: Style) -> torch.Tensor:
    k = a.shape[-1]
    out_dtype = torch.result_type(a, b)
    acc = accumulator(a.dtype, b.dtype)
    a, b = a.to(acc), b.to(acc)
    if style == "split":
        cuts = [0, k // 2, k]
    else:
        chunk = max(1, -(-k // MAX_SEQUENTIAL_STEPS))
        cuts = [*range(0, k, chunk), k]
    total: torch.Tensor | None = None
    for lo, hi in itertools.pairwise(cuts):
        if hi <= lo:
            continue
        if total is None:
            total = torch.matmul(a[..., lo:hi], _k_slice(b, lo, hi))
        else:
            total = _add_product(total, a[..., lo:hi], _k_slice(b, lo, hi))
    assert total is not None
    return total.to(out_dtype)


def _add_product(total: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """total + a @ b, the product rounded to the accumulator and then added, as `total + torch.matmul(a, b)` is.

    In place where it can be (addmm_/baddbmm_; the first total is always a fresh product): out of place, each of the
    sequential style's K steps (4,096 for a K = 4,096 GEMM) wrote two new output-sized tensors; in place is 4.5x
    faster on the CPU and 1.6x on an H100 (benchmarks/reorder_cost.py). With bf16 or fp16 inputs every K-column
    product is exact in fp32, so the result is the same bit for bit (tests/worker/test_honest_yardstick.py); with
    fp32 inputs a GPU's BLAS may fuse the multiply and the add, which is still an honest order (a loop of FMAs)."""
    if torch.is_grad_enabled() and (total.requires_grad or a.requires_grad or b.requires_grad):
        return total + torch.matmul(a, b)
    if total.dim() == a.dim() == b.dim() == 2:
        return total.addmm_(a, b)
    if total.dim() == a.dim() == b.dim() == 3 and a.shape[0] == b.shape[0] == total.shape[0]:
        return total.baddbmm_(a, b)
    return total.add_(torch.matmul(a, b))


def _floating(*ts: Any) -> bool:
    return all(isinstance(t, torch.Tensor) and t.dtype.is_floating_point for t in ts)


class Reorder(TorchFunctionMode):
    """Sums, means and matrix products in the reference, computed in `style` (see the module docstring)."""

    def __init__(self, style: Style) -> None:
        super().__init__()
        self.style = style
        self.rewritten = 0

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = dict(kwargs or {})
        try:
            result = self._rewrite(func, args, kwargs)
        except Exception:  # noqa: BLE001 - a call this mode cannot rewrite runs as torch runs it
            result = None
        if result is not None:
            self.rewritten += 1
            return result
        return func(*args, **kwargs)

    def _rewrite(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
        if func in _SUMS or func in _MEANS:
            x = args[0]
            if not _floating(x) or x.numel() < 2 or "out" in kwargs:
                return None
            dim = args[1] if len(args) > 1 else kwargs.get("dim", kwargs.get("axis"))
            keepdim = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
            dtype = kwargs.get("dtype")
            return _reduce(x, dim, keepdim, dtype, self.style, mean=func in _MEANS)
        if func in _MATMULS:
            a, b = args[0], args[1]
            if not _floating(a, b) or a.dim() == 0 or b.dim() == 0 or "out" in kwargs or a.shape[-1] < 2:
                return None
            return _matmul(a, b, self.style)
        if func in _LINEAR:
            x, w = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if not _floating(x, w) or x.shape[-1] < 2:
                return None
            out = _matmul(x, w.t() if w.dim() == 2 else w, self.style)
            return out if bias is None else (out.to(accumulator(out.dtype, bias.dtype)) + bias).to(out.dtype)
        return None
