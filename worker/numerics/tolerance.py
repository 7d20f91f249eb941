"""The benchmark's elementwise rule, as SOL-ExecBench's verifier applies it.

An output passes when it has the expected shape and dtype, holds no NaN/Inf, is
not all zero against a non-zero reference, and at least `min_match` of its
elements satisfy |a - b| <= atol + rtol * |b| (b: the reference).
"""

from __future__ import annotations

import torch
from pydantic import BaseModel

from worker.problem_spec import Tolerance


class OutputComparison(BaseModel):
    name: str
    ok: bool
    reason: str = ""
    numel: int = 0
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    match_fraction: float | None = None
    nonfinite: int = 0


def _as_f64(t: torch.Tensor) -> torch.Tensor:
    if t.is_complex():
        raise TypeError("complex outputs are not supported")
    return t.to(torch.float64)


def compare_output(
    name: str,
    out: object,
    ref: torch.Tensor,
    expected_dtype: torch.dtype,
    tol: Tolerance,
) -> OutputComparison:
    """Judge one kernel output `out` against the trusted reference `ref` (any device)."""
    if not isinstance(out, torch.Tensor):
        return OutputComparison(
            name=name, ok=False, reason=f"{name}: the kernel returned a {type(out).__name__}, not a tensor"
        )
    exp_shape = tuple(ref.shape)
    if tuple(out.shape) != exp_shape:
        return OutputComparison(
            name=name, ok=False, reason=f"{name}: shape {list(out.shape)}, expected {list(exp_shape)}"
        )
    if out.dtype != expected_dtype:
        return OutputComparison(
            name=name,
            ok=False,
            reason=f"{name}: dtype {str(out.dtype).removeprefix('torch.')}, expected {str(expected_dtype).removeprefix('torch.')}",
        )
    numel = out.numel()
    if numel == 0:
        return OutputComparison(name=name, ok=True, numel=0, max_abs_err=0.0, max_rel_err=0.0, match_fraction=1.0)
    a = _as_f64(out.to(ref.device))
    b = _as_f64(ref)
    finite = torch.isfinite(a)
    nonfinite = int(numel - int(finite.sum()))
    if nonfinite:
        return OutputComparison(
            name=name,
            ok=False,
            numel=numel,
            nonfinite=nonfinite,
            reason=f"{name}: {nonfinite} of {numel} elements are NaN/Inf (unwritten or overflowed output)",
        )
    diff = (a - b).abs()
    # where the reference itself is not finite, only an identical value matches
    ref_finite = torch.isfinite(b)
    diff = torch.where(ref_finite, diff, torch.where(a == b, 0.0, float("inf")))
    bound = tol.atol + tol.rtol * b.abs().nan_to_num(posinf=0.0, neginf=0.0)
    matched = diff <= bound
    frac = float(matched.sum()) / numel
    max_abs = float(diff.max())
    # relative error where it is meaningful: |b| at least atol
    big = b.abs() >= tol.atol
    max_rel = float((diff[big] / b.abs()[big]).max()) if bool(big.any()) else 0.0
    result = OutputComparison(
        name=name, ok=True, numel=numel, max_abs_err=max_abs, max_rel_err=max_rel, match_fraction=frac
    )
    if bool((a == 0).all()) and bool((b != 0).any()):
        result.ok = False
        result.reason = f"{name}: the output is all zero and the reference is not"
    elif frac < tol.min_match:
        result.ok = False
        result.reason = (
            f"{name}: {frac:.2%} of elements within atol={tol.atol:g}, rtol={tol.rtol:g} "
            f"(needs {tol.min_match:.0%}); max abs error {max_abs:.3g}"
        )
    return result
