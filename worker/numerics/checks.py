"""Behavioural checks that need no oracle: run twice, poison the outputs, inputs untouched, order-free.

Each check compares tensors the submission's process handed back; nothing here runs
submission code. Differences are counted in ulps of the output dtype, so that rounding-level
differences (atomics on a GPU legitimately reorder fp32 sums) are told apart from real ones.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from pydantic import BaseModel, Field

from worker import generated
from worker.numerics.placement import on_device_or_cpu

# run twice: more than this many elements differing by more than ULP_SLACK ulps is nondeterminism
ULP_SLACK = 2.0
FEW_ELEMENTS = 4
FEW_FRACTION = 1e-4
# reordering an order-free axis: an fp32 accumulator changes ~no element, a bf16 one 0.3-0.9% of them
CHANGED_FRACTION = 1e-3
CHANGED_MIN = 8

POISON_A = math.nan
POISON_B = -7.0


class CheckResult(BaseModel):
    name: str
    passed: bool
    summary: str
    details: dict[str, Any] = Field(default_factory=dict)


def ulps(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """|a - b| in units in the last place of `dtype` at max(|a|, |b|); NaN vs NaN is 0, NaN vs a number is inf."""
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    both_nan = torch.isnan(a64) & torch.isnan(b64)
    finfo = torch.finfo(dtype)
    mag = torch.maximum(a64.abs(), b64.abs()).clamp_min(finfo.smallest_normal)
    _, exponent = torch.frexp(mag)
    ulp = torch.ldexp(torch.full_like(mag, finfo.eps), (exponent - 1).to(torch.int64))
    d = (a64 - b64).abs() / ulp
    d = torch.where(both_nan, torch.zeros_like(d), d)
    d = torch.where(torch.isnan(d), torch.full_like(d, math.inf), d)
    # the same infinity on both sides is equal
    same = a64 == b64
    return torch.where(same, torch.zeros_like(d), d)


def few(numel: int) -> int:
    return max(FEW_ELEMENTS, int(FEW_FRACTION * numel))


def _float_pairs(
    names: list[str], a: list[torch.Tensor], b: list[torch.Tensor]
) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    return [(n, x, y) for n, x, y in zip(names, a, b) if x.dtype.is_floating_point]


def _beside(outs_a: list[torch.Tensor], outs_b: list[torch.Tensor]) -> list[torch.Tensor]:
    """outs_b on outs_a's devices: outputs come back on the device (worker.sandbox.device_share) or, where it had
    no room, on the host."""
    return [b.to(a.device) for a, b in zip(outs_a, outs_b)]


def check_determinism(
    names: list[str], outs_a: list[torch.Tensor], outs_b: list[torch.Tensor], poison_a: float, poison_b: float
) -> CheckResult:
    """The same inputs twice: differences beyond a couple of ulps on more than a few elements are flagged."""
    per_output: dict[str, Any] = {}
    bad = []
    for name, a, b in zip(names, outs_a, _beside(outs_a, outs_b)):
        written = ~(_is_poison(a, poison_a) | _is_poison(b, poison_b))
        if a.dtype.is_floating_point:
            d = ulps(a, b, a.dtype)[written]
            beyond = int((d > ULP_SLACK).sum())
            per_output[name] = {
                "elements": int(written.sum()),
                "differ": int((d > 0).sum()),
                "beyond_slack": beyond,
                "max_ulps": float(d.max()) if d.numel() else 0.0,
            }
        else:
            beyond = int((a != b)[written].sum())
            per_output[name] = {"elements": int(written.sum()), "differ": beyond, "beyond_slack": beyond}
        if beyond > few(a.numel()):
            bad.append(name)
    if bad:
        n = bad[0]
        o = per_output[n]
        summary = (
            f"nondeterministic: two runs on the same inputs differ in {o['beyond_slack']} elements of '{n}' "
            f"by more than {ULP_SLACK:g} ulps (max {o.get('max_ulps', float('nan')):.3g} ulps)"
        )
    else:
        summary = f"two runs agree to within {ULP_SLACK:g} ulps (up to {FEW_ELEMENTS} elements or {FEW_FRACTION:g} of them excepted)"
    return CheckResult(
        name="determinism", passed=not bad, summary=summary, details={"outputs": per_output, "ulp_slack": ULP_SLACK}
    )


def _is_poison(t: torch.Tensor, poison: float) -> torch.Tensor:
    if t.dtype.is_floating_point:
        return torch.isnan(t) if math.isnan(poison) else t == torch.tensor(poison, dtype=t.dtype)
    return torch.zeros_like(t, dtype=torch.bool)


def check_poison(
    names: list[str], outs_a: list[torch.Tensor], outs_b: list[torch.Tensor], poison_a: float, poison_b: float
) -> CheckResult:
    """Two calls with outputs pre-filled with two poison values: an element equal to the poison in both is unwritten."""
    per_output: dict[str, Any] = {}
    bad = []
    for name, a, b in _float_pairs(names, outs_a, _beside(outs_a, outs_b)):
        unwritten = _is_poison(a, poison_a) & _is_poison(b, poison_b)
        n = int(unwritten.sum())
        examples = [list(map(int, idx)) for idx in unwritten.nonzero()[:8].tolist()]
        rows = int(unwritten.reshape(a.shape[0], -1).any(dim=1).sum()) if a.dim() >= 1 and a.shape[0] else int(n > 0)
        per_output[name] = {"elements": a.numel(), "unwritten": n, "rows_with_unwritten": rows, "examples": examples}
        if n:
            bad.append(name)
    if bad:
        o = per_output[bad[0]]
        summary = (
            f"{o['unwritten']} of {o['elements']} elements of '{bad[0]}' are never written (in {o['rows_with_unwritten']} "
            f"rows, e.g. {o['examples'][:3]}): the kernel relies on the output buffer's previous contents"
        )
    else:
        summary = "every output element is written (outputs pre-filled with NaN, then with -7)"
    return CheckResult(
        name="outputs_written",
        passed=not bad,
        summary=summary,
        details={"outputs": per_output, "poison": [repr(poison_a), repr(poison_b)]},
    )


def _same(a: Any, b: Any, device: str = "cpu") -> bool:
    """Whether the input `a` the parent sent is what the kernel left (`b`): a copy, or a digest of its bits
    (worker.generated.digest, computed here on `device`: bit for bit, so a NaN's payload or a zero's sign counts)."""
    if isinstance(a, torch.Tensor) and generated.is_digest(b):
        return on_device_or_cpu(device, lambda d: generated.digest(a.to(d))) == b[generated.DIGEST_KEY]
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.dtype.is_floating_point:
            return bool(
                torch.equal(torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0))
                and torch.equal(a.isnan(), b.isnan())
            )
        return bool(torch.equal(a, b))
    return bool(a == b)


def check_inputs_unmodified(
    input_names: list[str], calls: list[tuple[str, list[Any], list[Any]]], device: str = "cpu"
) -> CheckResult:
    """Every call's inputs, as the kernel left them (copies, or digests of them), against the pristine copies sent."""
    mutated: dict[str, list[str]] = {}
    for label, sent, after in calls:
        for name, s, a in zip(input_names, sent, after):
            if not _same(s, a, device):
                mutated.setdefault(name, []).append(label)
    if mutated:
        name, where = next(iter(mutated.items()))
        summary = (
            f"the kernel modifies its input '{name}' in place (in {len(where)} of {len(calls)} calls, e.g. {where[0]}): "
            "a reference run after it would see different inputs"
        )
    else:
        summary = f"inputs unchanged after all {len(calls)} calls"
    return CheckResult(
        name="inputs_unmodified", passed=not mutated, summary=summary, details={"mutated": mutated, "calls": len(calls)}
    )


def check_permutation(
    names: list[str],
    outs: list[torch.Tensor],
    outs_perm: list[torch.Tensor],
    permuted_dims: dict[str, list[int]],
    perm: torch.Tensor,
    axis: str,
) -> CheckResult:
    """Permute the inputs along an order-free axis: outputs indexed by it permute along, reduced ones stay put."""
    per_output: dict[str, Any] = {}
    bad = []
    for name, a, b in zip(names, outs, _beside(outs, outs_perm)):
        expected = a
        for dim in permuted_dims.get(name, []):
            expected = expected.index_select(dim, perm.to(a.device))
        if a.dtype.is_floating_point:
            d = ulps(expected, b, a.dtype)
            changed, beyond = int((d > 0).sum()), int((d > ULP_SLACK).sum())
            max_ulps = float(d.max()) if d.numel() else 0.0
        else:
            changed = beyond = int((expected != b).sum())
            max_ulps = 0.0
        per_output[name] = {
            "elements": a.numel(),
            "changed": changed,
            "changed_fraction": changed / max(a.numel(), 1),
            "beyond_slack": beyond,
            "max_ulps": max_ulps,
            "kind": "permuted along" if permuted_dims.get(name) else "reduced over the axis",
        }
        if changed > max(CHANGED_MIN, int(CHANGED_FRACTION * a.numel())) or beyond > few(a.numel()):
            bad.append(name)
    if bad:
        o = per_output[bad[0]]
        summary = (
            f"order-dependent: permuting along '{axis}' changed {o['changed_fraction']:.2%} of '{bad[0]}' "
            f"({o['beyond_slack']} elements by more than {ULP_SLACK:g} ulps, max {o['max_ulps']:.3g}); "
            "an fp32 accumulator changes ~none"
        )
    else:
        summary = f"permuting along '{axis}' changes outputs at most at rounding level"
    return CheckResult(
        name="order_invariance",
        passed=not bad,
        summary=summary,
        details={"axis": axis, "outputs": per_output, "changed_fraction_limit": CHANGED_FRACTION},
    )
