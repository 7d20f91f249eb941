"""Error against the fp64 oracle, per reduction group, judged against the ideal output's error.

For each group (e.g. one embedding row, the whole gamma vector):
  err      = ||out - oracle||_2
  ideal    = ||round_to_output_dtype(oracle) - oracle||_2   (rounding once: the best any kernel can do)
  ratio    = err / max(ideal, FLOOR_FRACTION * u * ||oracle||_2)
where u is the output dtype's unit roundoff. The floor matters where the ideal output is
(nearly) exact, e.g. a row with one contribution of a bf16 input: there the ideal error is
0 and a correct kernel's error is 0 too, while any rounding the kernel adds is judged
against a fraction of one rounding of the group. Groups whose oracle norm is 0 (rows no
token hit, the padding row) must be exactly zero: any non-zero value there is reported.
Where honest implementations are given (the generic path: the reference at its own dtypes and re-run with its
reductions in other orders, worker.numerics.reorder), each group's denominator is also at least the largest error
any of them makes there: an honest fp32 kernel that sums in another order cannot reach the ideal output either,
and is judged against what honest kernels achieve, not against a result no kernel can produce.
A group whose norm is a tiny fraction of the typical group's (e.g. the cross-entropy gradient
row of a token predicted with probability 1 - 1e-12, where fp32's 1 - p cancels) is judged
against NEGLIGIBLE_FRACTION of the median group norm instead of its own: at that scale its
error cannot matter next to the rest of the tensor, while relative to itself it is unbounded.
"""

from __future__ import annotations

import math

import torch
from pydantic import BaseModel, Field

from worker.problem_spec import OutputBudget

FLOOR_FRACTION = 0.25
NEGLIGIBLE_FRACTION = 1e-2
# rows bucketed by how many contributions they sum: [lo, hi)
INDEX_COUNT_EDGES: tuple[tuple[int, int | None], ...] = ((0, 1), (1, 2), (2, 8), (8, 64), (64, 512), (512, None))


def bucket_label(lo: int, hi: int | None) -> str:
    if hi is None:
        return f">={lo}"
    if hi == lo + 1:
        return str(lo)
    return f"{lo}-{hi - 1}"


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half a float dtype's epsilon; 0 for an integer or bool dtype, whose values are exact."""
    return float(torch.finfo(dtype).eps) / 2 if dtype.is_floating_point else 0.0


def floor_note(dtype: torch.dtype) -> str:
    u = unit_roundoff(dtype)
    return (
        f"the denominator (the ideal output's error) is floored at {FLOOR_FRACTION} * u * max(||oracle group||, "
        f"{NEGLIGIBLE_FRACTION} * median group norm), "
        f"u = {u:.3g} (unit roundoff of {str(dtype).removeprefix('torch.')}), where the ideal output is (nearly) exact"
    )


class BucketError(BaseModel):
    label: str
    lo: int
    hi: int | None
    groups: int = Field(description="groups with a non-zero oracle in this bucket")
    zero_groups: int = Field(0, description="groups whose oracle is exactly zero")
    zero_groups_nonzero: int = Field(0, description="of those, groups where the output is not zero")
    mean_label: float = Field(0.0, description="mean multiplicity / reduction length of the groups")
    rel_err: float = Field(0.0, description="||out - oracle|| / ||oracle|| over the bucket")
    ideal_rel_err: float = Field(0.0, description="the same for the ideal output")
    ratio: float = 0.0
    worst_group_ratio: float = 0.0


class OutputError(BaseModel):
    output: str
    dtype: str
    max_ratio: float
    groups: int
    group_dims: list[int]
    worst_ratio: float = 0.0
    worst_group: list[int] = Field(default_factory=list)
    worst_group_label: int | None = None
    rel_err: float = 0.0
    ideal_rel_err: float = 0.0
    honest_rel_err: float | None = Field(None, description="the largest error of an honest implementation, relative")
    honest_worst: str | None = Field(None, description="which honest implementation erred most")
    floored_groups: int = Field(0, description="groups whose denominator was the floor")
    zero_groups: int = 0
    zero_groups_nonzero: int = 0
    zero_group_examples: list[list[int]] = Field(default_factory=list)
    nonfinite: int = Field(0, description="non-finite output elements where the oracle is finite")
    mismatches: int | None = Field(None, description="integer outputs: elements that differ")
    bucket_kind: str | None = None
    buckets: list[BucketError] = Field(default_factory=list)

    @property
    def passed(self) -> bool:
        return (
            self.worst_ratio <= self.max_ratio
            and self.zero_groups_nonzero == 0
            and self.nonfinite == 0
            and not self.mismatches
        )


def as_groups(t: torch.Tensor, group_dims: list[int]) -> torch.Tensor:
    """[G, M]: one row per reduction group (group_dims index the groups; [] = one group)."""
    if t.dim() == 0:
        return t.reshape(1, 1)
    dims = sorted({d % t.dim() for d in group_dims})
    rest = [d for d in range(t.dim()) if d not in dims]
    g = math.prod(t.shape[d] for d in dims) if dims else 1
    return t.permute(*dims, *rest).reshape(g, -1)


def _unravel(index: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for size in reversed(shape):
        out.append(index % size)
        index //= size
    return list(reversed(out))


def measure_output(
    name: str,
    out: torch.Tensor,
    oracle: torch.Tensor,
    dtype: torch.dtype,
    budget: OutputBudget,
    labels: torch.Tensor | None = None,
    edges: tuple[tuple[int, int | None], ...] = INDEX_COUNT_EDGES,
    bucket_kind: str | None = None,
    honest: dict[str, torch.Tensor] | None = None,
) -> OutputError:
    """Error of `out` against the fp64 `oracle`; `labels` (one int per group) bucket the groups; `honest` (name ->
    output of an honest implementation) raises each group's denominator to the largest honest error there."""
    if tuple(out.shape) != tuple(oracle.shape):
        raise ValueError(f"output '{name}' has shape {tuple(out.shape)}, the oracle's is {tuple(oracle.shape)}")
    dims = sorted({d % out.dim() for d in budget.group_dims}) if out.dim() else []
    group_shape = tuple(out.shape[d] for d in dims)
    if not dtype.is_floating_point:
        mismatches = int((out.to(torch.int64) != oracle.round().to(torch.int64)).sum())
        return OutputError(
            output=name,
            dtype=str(dtype).removeprefix("torch."),
            max_ratio=budget.max_ratio,
            groups=math.prod(group_shape),
            group_dims=dims,
            mismatches=mismatches,
        )
    ref = as_groups(oracle.to(torch.float64), dims)
    sub = as_groups(out.to(torch.float64), dims)
    ideal = as_groups(oracle.to(torch.float64).to(dtype).to(torch.float64), dims)
    ref_ok = torch.isfinite(ref).all(dim=1)
    nonfinite = int((~torch.isfinite(sub) & torch.isfinite(ref)).sum())
    diff = torch.where(torch.isfinite(sub), sub - ref, torch.full_like(sub, math.inf))
    err = torch.linalg.vector_norm(torch.nan_to_num(diff, nan=math.inf), dim=1)
    ideal_err = torch.linalg.vector_norm(ideal - ref, dim=1)
    norm = torch.linalg.vector_norm(ref, dim=1)
    u = unit_roundoff(dtype)
    live_norms = norm[ref_ok & (norm > 0)]
    typical = float(live_norms.median()) if live_norms.numel() else 0.0
    floor = FLOOR_FRACTION * u * torch.clamp(norm, min=NEGLIGIBLE_FRACTION * typical)
    denom = torch.maximum(ideal_err, floor)
    honest_err: torch.Tensor | None = None
    honest_names: dict[str, float] = {}
    for hname, h in (honest or {}).items():
        if tuple(h.shape) != tuple(out.shape):
            continue
        hg = as_groups(h.to(torch.float64), dims)
        if not bool(torch.isfinite(hg[ref_ok]).all()):
            continue  # an honest run that overflows where the oracle does not is no yardstick
        e = torch.linalg.vector_norm(hg - ref, dim=1)
        honest_names[hname] = float(torch.linalg.vector_norm(e[ref_ok]))
        honest_err = e if honest_err is None else torch.maximum(honest_err, e)
    if honest_err is not None:
        # per group, the largest honest error there; and everywhere at least the honest runs' typical relative error:
        # one group's rounding errors are a random walk, so a single honest sample is a noisy yardstick for it
        live_ref = ref_ok & (norm > 0)
        scale = (
            float(torch.linalg.vector_norm(honest_err[live_ref]) / torch.linalg.vector_norm(norm[live_ref]))
            if bool(live_ref.any())
            else 0.0
        )
        denom = torch.maximum(denom, torch.maximum(honest_err, scale * norm))
    zero = ref_ok & (norm == 0)
    live = ref_ok & (norm > 0)
    ratio = torch.where(live, err / torch.where(live, denom, torch.ones_like(denom)), torch.zeros_like(err))
    zero_nonzero = zero & (err > 0)
    worst = int(torch.argmax(torch.where(live, ratio, torch.full_like(ratio, -1.0)))) if bool(live.any()) else 0

    def rel(e: torch.Tensor, mask: torch.Tensor) -> float:
        n = float(torch.linalg.vector_norm(norm[mask]))
        return float(torch.linalg.vector_norm(e[mask])) / n if n > 0 else 0.0

    def bucket_ratio(mask: torch.Tensor) -> float:
        n = float(torch.linalg.vector_norm(norm[mask]))
        if n == 0:
            return 0.0
        d = max(
            float(torch.linalg.vector_norm(ideal_err[mask])),
            FLOOR_FRACTION * u * n,
            float(torch.linalg.vector_norm(honest_err[mask])) if honest_err is not None else 0.0,
        )
        return float(torch.linalg.vector_norm(err[mask])) / d

    result = OutputError(
        output=name,
        dtype=str(dtype).removeprefix("torch."),
        max_ratio=budget.max_ratio,
        groups=int(ref.shape[0]),
        group_dims=dims,
        worst_ratio=float(ratio[worst]) if bool(live.any()) else 0.0,
        worst_group=_unravel(worst, group_shape) if group_shape else [],
        worst_group_label=int(labels[worst]) if labels is not None and bool(live.any()) else None,
        rel_err=rel(err, live),
        ideal_rel_err=rel(ideal_err, live),
        honest_rel_err=rel(honest_err, live) if honest_err is not None else None,
        honest_worst=max(honest_names, key=lambda k: honest_names[k]) if honest_names else None,
        floored_groups=int((live & (floor > ideal_err)).sum()),
        zero_groups=int(zero.sum()),
        zero_groups_nonzero=int(zero_nonzero.sum()),
        zero_group_examples=[
            _unravel(int(i), group_shape) if group_shape else [] for i in zero_nonzero.nonzero().flatten()[:8]
        ],
        nonfinite=nonfinite,
        bucket_kind=bucket_kind,
    )
    if labels is not None:
        labels = labels.to(torch.int64).reshape(-1)
        for lo, hi in edges:
            in_bucket = (labels >= lo) & (
                (labels < hi) if hi is not None else torch.ones_like(labels, dtype=torch.bool)
            )
            mask = in_bucket & live
            zmask = in_bucket & zero
            if not bool(in_bucket.any()):
                continue
            result.buckets.append(
                BucketError(
                    label=bucket_label(lo, hi),
                    lo=lo,
                    hi=hi,
                    groups=int(mask.sum()),
                    zero_groups=int(zmask.sum()),
                    zero_groups_nonzero=int((zmask & zero_nonzero).sum()),
                    mean_label=float(labels[in_bucket].double().mean()),
                    rel_err=rel(err, mask),
                    ideal_rel_err=rel(ideal_err, mask),
                    ratio=bucket_ratio(mask),
                    worst_group_ratio=float(ratio[mask].max()) if bool(mask.any()) else 0.0,
                )
            )
    return result


def index_count_labels(ids: torch.Tensor, groups: int) -> torch.Tensor:
    """How many positions of `ids` name each of `groups` rows."""
    flat = ids.reshape(-1).to(torch.int64)
    flat = flat[(flat >= 0) & (flat < groups)]
    return torch.bincount(flat, minlength=groups)[:groups]
