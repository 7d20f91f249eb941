"""Whether a Triton kernel did bf16 arithmetic under Triton's CPU interpreter, whose answer is then meaningless.

The interpreter stores a bf16 value as its 16 bits in a numpy uint16 array and hands that array to numpy's
arithmetic as it is: `x * x` on bf16 multiplies the bit patterns as integers, `tl.sum` adds them, a comparison
orders negative numbers backwards. Loads, stores and the bf16 <-> fp32 casts are exact, so a kernel that converts to
fp32 before it computes runs correctly; one that computes in bf16 (SOL-ExecBench's own sample RMSNorm does
`x * x` and `x / rms` on its loaded bf16 row) returns garbage, and its audit on the CPU can neither pass nor fail
it. On a GPU the same kernel computes in real bf16.

The watch wraps the interpreter's arithmetic entry points and records the first time one of them receives a bf16
operand. It runs in the sandbox child, so the kernel can switch it on or off; that moves a CPU verdict only between
`fail` and `error` (inconclusive), never to `pass` (worker.stages.benchmark.correctness, worker.stages.probes).

The interpreter also converts fp32 to bf16 by truncating the low bits, where a GPU (and torch) rounds to nearest
even: a kernel that rounds an intermediate to bf16 and then computes on (OLMo's post-norm rounds the normalised
row, then adds the residual) doubles its error there and fails an honest budget. That conversion is exact to
specify, so the child makes it the GPU's instead of watching it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

# what a CPU worker lacks to judge such a kernel (worker.report.WORKER_LIMIT)
LIMIT = "bf16 arithmetic in Triton needs a GPU: Triton's CPU interpreter computes it on the raw bits"


def inconclusive(op: str) -> str:
    """What a stage says of such a kernel's numeric failure on a CPU worker (`op`: the first bf16 op seen)."""
    return (
        f"inconclusive on this CPU worker: the kernel does bf16 arithmetic in Triton (first in the interpreter's {op}), "
        "which Triton's CPU interpreter computes on the raw bits, so its outputs here say nothing about the kernel; "
        "audit it on a GPU worker, or convert to fp32 before computing"
    )


# numpy ops that are exact on a bf16 value's bits: moving or selecting them is not arithmetic
_BIT_EXACT = frozenset({np.bitwise_and, np.bitwise_or, np.bitwise_xor, np.where})

# the interpreter builder's arithmetic: the shared two- and three-operand paths and the ops that bypass them
_BUILDER_METHODS = ("binary_op", "ternary_op", "unary_op", "create_fma", "create_rsqrt", "create_erf", "create_dot")


class Bf16Watch:
    """`op`: the first interpreter op that took a bf16 operand since install(); None while none has."""

    def __init__(self) -> None:
        self.op: str | None = None

    def install(self) -> bool:
        """Wraps the interpreter's arithmetic; False where Triton (or its interpreter) is not importable."""
        try:
            import triton.language as tl
            from triton.runtime import interpreter
        except Exception:  # noqa: BLE001 - no Triton here: nothing a kernel could run under its interpreter
            return False
        builder = interpreter.InterpreterBuilder
        builder.cast_impl = _rounding_cast(builder.cast_impl, interpreter.TensorHandle, tl)
        for name in _BUILDER_METHODS:
            original = getattr(builder, name, None)
            if callable(original):
                setattr(builder, name, self._wrap(name, original, tl.bfloat16))
        reduce_scan = getattr(interpreter, "ReduceScanOpInterface", None)
        if reduce_scan is not None:  # tl.sum, tl.max, tl.cumsum: numpy reductions of the uint16 bits
            reduce_scan.apply = self._wrap("reduce", reduce_scan.apply, tl.bfloat16)
        return True

    def _wrap(self, name: str, original: Callable[..., Any], bf16: Any) -> Callable[..., Any]:
        @functools.wraps(original)
        def watched(*args: Any) -> Any:
            exact = any(a is op for a in args for op in _BIT_EXACT)
            if self.op is None and not exact and any(_is_bf16(a, bf16) for a in args[1:]):
                self.op = name
            return original(*args)

        return watched


def _is_bf16(value: Any, bf16: Any) -> bool:
    """A TensorHandle or tl.tensor of bf16 elements; a tuple of them (a reduction's operands)."""
    if isinstance(value, tuple):
        return any(_is_bf16(v, bf16) for v in value)
    dtype = getattr(value, "dtype", None)
    return getattr(dtype, "scalar", dtype) == bf16


def round_to_bf16(values: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bits, rounded to nearest even as the GPU and torch do; NaN stays a (quiet) NaN of its sign."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32)  # keeps a 0-d scalar's shape
    out = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(values)
    if np.any(nan):
        out[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return out


def _rounding_cast(original: Callable[..., Any], handle: Any, tl: Any) -> Callable[..., Any]:
    """The interpreter's cast, with fp32 -> bf16 rounded to nearest even instead of truncated."""

    @functools.wraps(original)
    def cast(builder: Any, src: Any, dst_type: Any) -> Any:
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return handle(round_to_bf16(src.data), tl.bfloat16)
        return original(builder, src, dst_type)

    return cast
