"""Derive an audit spec (budgets and probes) from an uncurated definition and its workloads.

The probes start from a base workload of the profile (the median one by input size), draw their
axes from the audit's seed (worker.generic.shapes) and make every input they do not list the way
that workload makes it (`ProbeSpec.base_workload`). Each probe carries the reason it applies; the
plan lists the probes that do not apply and why.
"""

from __future__ import annotations

import math
from collections.abc import Callable
import re

import torch
from pydantic import BaseModel, Field

from worker.formats import Definition, Workload
from worker.generic import shapes
from worker.generic.roles import InputRole, classify, pad_scalar
from worker.generic.structure import Structure, infer_structure
from worker.inputs import build_case
from worker.numerics.dtypes import to_torch
from worker.problem_spec import (
    AuditSpec,
    BucketBy,
    InputGenerator,
    OutputBudget,
    ProbeSpec,
)
from worker.reference import ReferenceRunner

SCALES = (1e-4, 1e-2, 1e3)
OFFSET_MEAN = 100.0
LONG_FACTOR = {"cpu": 8, "gpu": 4}
MAX_LONG_AXES = 2
SMALL_CONSTANT = 1e-2  # a float scalar below this is an eps: it matters only where the activations are comparably small
EPS_MOVE = 100.0  # an eps moves up by this factor (1e-6 -> 1e-4): a kernel that hard-codes the workload's value shows
SCALE_MOVE = 2.0  # any other float scalar (a scale, an alpha) doubles
# |row mean| / row std of the large-offset probe: from where a one-pass variance in fp32 starts to lose digits (its
# error is about ratio^2 * 6e-8 of the variance: 6e-4 at 1e2) to where it loses all of them (6 at 1e4)
LARGE_OFFSET_RATIOS = (1e2, 1e4)
# an integer named so holds token positions (or bounds them): real contexts reach 2^20 tokens, the benchmark's do not
_POSITION_WORDS = re.compile(r"(^|_)(pos|positions?|position_ids|start_pos|timesteps?)($|_)", re.I)


def float_scalars(definition: Definition, base: Workload, roles: dict[str, InputRole]) -> dict[str, float]:
    """The definition's float scalar inputs that no axis fixes, with the base workload's value: constants of the op
    (an eps, a scale) that a kernel may hard-code instead of reading."""
    out = {}
    for name, role in roles.items():
        w = base.inputs.get(name)
        spec = definition.inputs[name]
        if (
            role.role == "scalar"
            and role.tied_axis is None
            and w is not None
            and w.type == "scalar"
            and spec.dtype.startswith(("float", "bfloat"))
            and isinstance(w.value, (int, float))
            and not isinstance(w.value, bool)
        ):
            out[name] = float(w.value)
    return out


def moved_scalar(value: float) -> float:
    """Where a constant is worth moving to: an eps up by EPS_MOVE, anything else doubled, zero to a small eps."""
    if value == 0.0:
        return 1e-3
    return value * (EPS_MOVE if abs(value) < SMALL_CONSTANT else SCALE_MOVE)


def offset_std(dtype: torch.dtype, max_ratio: float) -> float:
    """The within-row spread of a large-offset draw: 1, or less where the offset (max_ratio spreads, plus the spread's
    own tail) would not fit the dtype (fp8's 448), so the rows stay finite and only the offset is large."""
    top = torch.finfo(dtype).max / (2.0 * (max_ratio + 8.0))
    return min(1.0, top)


def position_like(name: str, description: str | None) -> bool:
    """An integer named or described as token positions (or their bound): a value the probes should push to the
    positions of a long context."""
    return bool(_POSITION_WORDS.search(name)) or bool(re.search(r"\bpositions?\b", description or "", re.I))


class GenericPlan(BaseModel):
    """What the generic path decided for one audit, and why."""

    spec: AuditSpec
    base_workload: str
    base_axes: dict[str, int]
    roles: dict[str, InputRole]
    structure: Structure
    skipped: list[str] = Field(default_factory=list, description="probes that do not apply, with the reason")
    axes_cut: dict[str, tuple[int, int]] = Field(
        default_factory=dict,
        description="axes the probes draw around a smaller size than the base workload's (workload, probe base): "
        "its inputs held more than shapes.PROBE_MAX_NUMEL elements",
    )

    def report(self) -> dict[str, object]:
        return {
            "base_workload": self.base_workload,
            "base_axes": self.base_axes,
            "inputs": {n: r.model_dump(exclude_none=True) for n, r in self.roles.items()},
            "structure": self.structure.model_dump(),
            "applied": {p.name: p.why for p in self.spec.probes},
            "not_applied": self.skipped,
            **({"axes_cut": {a: list(v) for a, v in self.axes_cut.items()}} if self.axes_cut else {}),
        }


def _size(definition: Definition, w: Workload) -> int:
    try:
        return shapes.numel_of(definition, {a: w.axes[a] for a in definition.var_axes})
    except (KeyError, ValueError):
        return 0


def base_workload(definition: Definition, workloads: tuple[Workload, ...]) -> Workload:
    """The median workload by input size: realistic but not the slowest."""
    usable = [w for w in workloads if all(a in w.axes for a in definition.var_axes)]
    if not usable:
        raise ValueError(f"{definition.name}: no workload gives every var axis {definition.var_axes}")
    ranked = sorted(usable, key=lambda w: _size(definition, w))
    return ranked[(len(ranked) - 1) // 2]


def _cut_phrase(axes_cut: dict[str, tuple[int, int]]) -> str:
    if not axes_cut:
        return ""
    cuts = ", ".join(f"{a} {w} -> {p}" for a, (w, p) in axes_cut.items())
    return (
        f", with {cuts} (the workload's inputs hold more than {shapes.PROBE_MAX_NUMEL:,} elements; reduced axes keep "
        "their length, and the benchmark stage ran the full size)"
    )


def _scalar_inputs(roles: dict[str, InputRole]) -> dict[str, InputGenerator]:
    """Scalars tied to an axis follow the drawn axes; the others keep the workload's value."""
    return {
        n: InputGenerator(kind="from_axis", axis=r.tied_axis)
        for n, r in roles.items()
        if r.role == "scalar" and r.tied_axis
    }


def _budgets(
    definition: Definition, structure: Structure, roles: dict[str, InputRole], precision_ratio: float
) -> dict[str, OutputBudget]:
    budgets = {}
    ids = [r for r in roles.values() if r.role == "ids"]
    for name, spec in definition.outputs.items():
        g = structure.outputs.get(name)
        dims = g.group_dims if g else []
        bucket = None
        shape = spec.shape or []
        if len(dims) == 1 and ids:
            hit = next((r for r in ids if shape[dims[0]] == r.high_axis), None)
            if hit is not None:
                bucket = BucketBy(kind="index_count", input=hit.name)
        budgets[name] = OutputBudget(group_dims=dims, max_ratio=precision_ratio, bucket_by=bucket)
    return budgets


def derive_plan(
    definition: Definition,
    workloads: tuple[Workload, ...],
    profile: str,
    seed: int,
    reference: ReferenceRunner,
    *,
    max_ratio: float = 4.0,
) -> GenericPlan:
    """Budgets and probes for `definition`, drawn from `seed` (one plan per audit).

    `reference` is the audit's own (worker.context): an uploaded definition's runs in its sandbox, so reading
    the structure and building custom inputs never execute the uploader's code here."""
    base = base_workload(definition, workloads)
    gen = torch.Generator().manual_seed(seed)
    base_axes = {a: int(base.axes[a]) for a in definition.var_axes}
    roles = classify(definition, base)
    small = min(workloads, key=lambda w: _size(definition, w) or math.inf)
    try:
        small_case = build_case(definition, reference, small, seed)
        structure = infer_structure(definition, small_case, seed, reference)
    except Exception as err:  # noqa: BLE001 - the workload's own inputs failed to build: judge outputs whole
        structure = Structure(
            note=f"could not build workload '{small.uuid}' to read the structure: {type(err).__name__}: {err}"[:300]
        )
    workload_axes = base_axes
    base_axes = shapes.within_numel(definition, base_axes, keep=tuple(structure.reduced_axes))
    axes_cut = {a: (workload_axes[a], v) for a, v in base_axes.items() if v != workload_axes[a]}
    scalars = _scalar_inputs(roles)
    probes: list[ProbeSpec] = []
    skipped: list[str] = []
    floats = [n for n, r in roles.items() if r.role == "float"]
    ids = [r for r in roles.values() if r.role == "ids"]
    tensors = [n for n, s in definition.inputs.items() if not s.is_scalar and s.shape]

    def add(
        name: str, why: str, axes: dict[str, int], inputs: dict[str, InputGenerator] | None = None, **extra: object
    ) -> None:
        probes.append(
            ProbeSpec(
                name=name,
                why=why,
                axes=axes,
                gpu_axes=axes,
                inputs={**(inputs or {}), **scalars},
                base_workload=base.uuid,
                **extra,
            )  # type: ignore[arg-type]
        )

    add(
        "workload_like",
        f"the benchmark's own distribution at axes drawn within +-{shapes.JITTER:.0%} of workload "
        f"'{base.uuid}'{_cut_phrase(axes_cut)} (keeping the power of two dividing each): the baseline, and the case "
        "for the behavioural checks",
        shapes.jittered_keeping_divisibility(definition, base_axes, gen),
    )
    for name in floats:
        for scale in SCALES:
            add(
                f"scale_{scale:g}:{name}",
                f"'{name}' at std {scale:g} (activations and gradients span 1e-4..1e3 in "
                "training): catches fp16 overflow, lost eps, underflowing sums of squares",
                shapes.jittered_keeping_divisibility(definition, base_axes, gen),
                {name: InputGenerator(kind="normal", std=scale)},
            )
        add(
            f"offset:{name}",
            f"'{name}' with mean {OFFSET_MEAN:g} and std 1 (un-centred activations, a residual "
            "stream's drift): one-pass statistics cancel",
            shapes.jittered_keeping_divisibility(definition, base_axes, gen),
            {name: InputGenerator(kind="normal", mean=OFFSET_MEAN, std=1.0)},
        )
        if len(definition.inputs[name].shape or []) >= 2:
            add(
                f"zero_rows:{name}",
                f"a quarter of the rows of '{name}' exactly zero (padding tokens, masked "
                "positions): a scale or norm of zero must not give 0/0",
                shapes.jittered_keeping_divisibility(definition, base_axes, gen),
                {name: InputGenerator(kind="zero_rows", fraction=0.25)},
            )
    for name, value in float_scalars(definition, base, roles).items():
        moved = moved_scalar(value)
        gens = {name: InputGenerator(kind="scalar", value=moved)}
        regime = ""
        if abs(moved) < SMALL_CONSTANT:  # activations whose squares are of the eps's size: there it is not negligible
            gens.update({f: InputGenerator(kind="normal", std=math.sqrt(abs(moved))) for f in floats})
            regime = f", with float inputs at std {math.sqrt(abs(moved)):.3g} where it is not negligible"
        add(
            f"constant:{name}",
            f"'{name}' moved from the workload's {value:g} to {moved:g}{regime}: a kernel that "
            "hard-codes the benchmark's value instead of reading it is right only on the benchmark",
            shapes.jittered_keeping_divisibility(definition, base_axes, gen),
            gens,
        )
    odd_axes = shapes.odd(definition, base_axes, gen)
    if odd_axes != base_axes:
        add("odd_shape", "axis sizes that are multiples of no block size: tail masks must be right", odd_axes)
    else:
        skipped.append("odd_shape: no var axis can take an odd size under the definition's constraints")
    if tensors:
        add(
            "strided",
            "inputs handed over as strided views (slices of a fused buffer): a kernel that assumes "
            "contiguous rows reads the wrong elements; advisory: the benchmark's contract is contiguous tensors, so a "
            "failure here is a note for whoever calls the kernel on views, not a verdict",
            shapes.jittered_keeping_divisibility(definition, base_axes, gen),
            noncontiguous=tensors,
            advisory=True,
        )
    reducible = [a for a in structure.reduced_axes if a in base_axes]
    for axis in reducible[:MAX_LONG_AXES]:
        axes = shapes.long_axis(definition, base_axes, axis, LONG_FACTOR.get(profile, 4), gen, keep=tuple(reducible))
        if axes is None:
            skipped.append(f"long_reduction:{axis}: no longer size fits the constraints and the size budget")
            continue
        add(
            f"long_reduction:{axis}",
            f"the reference reduces over '{axis}'; a {axes[axis]}-long reduction shows a "
            "low-precision accumulator's error growing with length",
            axes,
        )
    if not reducible:
        skipped.append(f"long_reduction: {structure.note or 'no var axis is reduced over'}")
    pad = pad_scalar(definition, base)
    for r in ids:
        high = r.high_axis or ""
        one = {"high_axis": high}
        add(
            f"zipf_ids:{r.name}",
            f"'{r.name}' are ids ({r.why}): Zipf s=1.1 as token frequencies are",
            shapes.jittered_keeping_divisibility(definition, base_axes, gen),
            {r.name: InputGenerator(kind="zipf_ids", s=1.1, **one)},
        )
        add(
            f"real_text_ids:{r.name}",
            f"'{r.name}' as real text tokenizes (or the user's token statistics)",
            shapes.jittered_keeping_divisibility(definition, base_axes, gen),
            {r.name: InputGenerator(kind="real_text_ids", **one)},
        )
        add(
            f"hot_id:{r.name}",
            f"half of '{r.name}' one id (a frequent token, a collapsed router): many contributions land on one row",
            shapes.jittered_keeping_divisibility(definition, base_axes, gen),
            {r.name: InputGenerator(kind="hot_id", fraction=0.5, **one)},
            adversarial=True,
        )
        if pad is None:
            skipped.append(f"padding:{r.name}: the definition has no pad/ignore scalar")
            continue
        axes = shapes.jittered_keeping_divisibility(definition, base_axes, gen)
        pad_name, pad_value = pad
        if pad_value >= definition.resolve_axes(axes).get(high, 0):
            skipped.append(f"padding:{r.name}: pad value {pad_name}={pad_value} is outside the ids' range")
            continue
        pad_inputs: dict[str, InputGenerator] = {}
        if pad_value < 0 and "pad" in pad_name.lower():  # padding_idx = -1 means "no pad row": make one, id 0
            pad_value = 0
            pad_inputs[pad_name] = InputGenerator(kind="scalar", value=0)
        add(
            f"padding:{r.name}",
            f"30% of '{r.name}' the pad value {pad_value} ({pad_name}), as padded batches are",
            axes,
            {**pad_inputs, r.name: InputGenerator(kind="padding_heavy", fraction=0.3, pad_value=pad_value, **one)},
        )
    if not ids:
        skipped.append("id distributions: no integer input is named or described as token ids, indices or targets")
    # drawn last from the shared generator, so the axes a seed gives every probe above do not depend on whether
    # these apply to the definition
    _large_offset_probes(definition, roles, base_axes, gen, add, skipped)
    _free_axis_probes(definition, roles, base, base_axes, gen, add, skipped)
    spec = AuditSpec(budgets=_budgets(definition, structure, roles, max_ratio), probes=probes)
    return GenericPlan(
        spec=spec,
        base_workload=base.uuid,
        base_axes=base_axes,
        roles=roles,
        structure=structure,
        skipped=skipped,
        axes_cut=axes_cut,
    )


def _large_offset_probes(
    definition: Definition,
    roles: dict[str, InputRole],
    base_axes: dict[str, int],
    gen: torch.Generator,
    add: Callable[..., None],
    skipped: list[str],
) -> None:
    """Rows of each activation input on their own large offset (worker.probes.distributions.offset_rows).

    The `offset:` probe shifts every row by 100 std, where a one-pass variance in fp32 still keeps about 3 digits
    and a bf16 output hides its error; activations drift further than that (a residual stream's DC component), and
    from about 1e3 std the cancellation leaves noise. Parameters (weights, gamma, a table) are left alone: their
    rows are features, not tokens that share a drift."""
    lo, hi = LARGE_OFFSET_RATIOS
    for name, r in roles.items():
        if r.role != "float":
            continue
        if not r.activation:
            skipped.append(f"large_offset:{name}: {r.why.split(', ', 1)[-1]}")
            continue
        std = offset_std(to_torch(definition.inputs[name].dtype), hi)
        add(
            f"large_offset:{name}",
            f"each row of '{name}' on its own offset, {lo:g} to {hi:g} times the row's spread (std {std:g}), sign "
            "random: activations with a large DC component (a residual stream's drift, a feature with a large bias). "
            "Statistics that cancel, such as a one-pass variance E[x^2] - E[x]^2, lose about ratio^2 * 6e-8 of the "
            "variance in fp32: noise, or negative, past a ratio of 1e3",
            shapes.jittered_keeping_divisibility(definition, base_axes, gen),
            {name: InputGenerator(kind="offset_rows", std=std, min_ratio=lo, max_ratio=hi)},
        )


def _free_axis_probes(
    definition: Definition,
    roles: dict[str, InputRole],
    base: Workload,
    base_axes: dict[str, int],
    gen: torch.Generator,
    add: Callable[..., None],
    skipped: list[str],
) -> None:
    """Free axes drawn large, and position-like integers pushed to a long context's positions.

    A var axis that sizes no tensor (rope's `max_position`) reaches the inputs only through the workload's custom
    generator or the constraints: the other probes jitter it by 25%, so positions stay as small as the benchmark's
    and fp32 index arithmetic (angles = position * inv_freq, exact below 2^24 but rounded to 2^-24 of the angle)
    never shows its error. Here it is drawn near 2^20 (a 1M-token context), or the largest the constraints allow.
    Without a free axis, an integer scalar or tensor named or described as positions is set near 2^20 directly."""
    target = shapes.FREE_AXIS_TARGET
    free = shapes.free_axes(definition, base_axes)
    for axis in free:
        axes = shapes.large_free_axis(
            definition, shapes.jittered_keeping_divisibility(definition, base_axes, gen), axis, gen
        )
        if axes is None:
            skipped.append(f"free_axis:{axis}: no value above the workload's satisfies the constraints")
            continue
        add(
            f"free_axis:{axis}",
            f"'{axis}' sizes no tensor: it reaches the inputs only through the workload's generator or the "
            f"constraints (positions below a max_position), so the other probes keep it near the benchmark's "
            f"{base_axes[axis]}; drawn at {axes[axis]} (a 1M-token context), where positions and offsets get large "
            "and fp32 index arithmetic (position * inv_freq) rounds the angle by up to 0.03 rad",
            axes,
        )
    if not free:
        skipped.append("free_axis: every var axis sizes a tensor")
    pad = pad_scalar(definition, base)
    for name, r in roles.items():
        spec = definition.inputs[name]
        dtype = to_torch(spec.dtype)
        if dtype.is_floating_point or dtype == torch.bool or not position_like(name, spec.description):
            continue
        if r.role not in ("scalar", "int") or r.tied_axis or (pad is not None and pad[0] == name):
            continue  # ids index a table, a tied scalar follows its axis, a pad id is a sentinel
        if free:
            skipped.append(f"large_position:{name}: the free axes {free} bound it through the workload's generator")
            continue
        bound = next(
            (
                c
                for c in definition.constraints
                if re.search(rf"\b{re.escape(name)}\b", c) and set(definition.axes) & set(re.findall(r"\w+", c))
            ),
            None,
        )
        if bound is not None:
            skipped.append(f"large_position:{name}: constraint '{bound}' bounds it by an axis")
            continue
        if torch.iinfo(dtype).max < target:
            skipped.append(f"large_position:{name}: {spec.dtype} cannot hold positions near {target}")
            continue
        value = target - int(torch.randint(1, target // 8 + 1, (1,), generator=gen))
        gens = (
            {name: InputGenerator(kind="scalar", value=value)}
            if spec.is_scalar
            else {name: InputGenerator(kind="uniform_int", low=value - target // 8, high=value)}
        )
        add(
            f"large_position:{name}",
            f"'{name}' holds token positions; set near {target} (a 1M-token context, the benchmark's are far "
            "shorter): fp32 index arithmetic (position * inv_freq) rounds by up to 0.03 rad there",
            shapes.jittered_keeping_divisibility(definition, base_axes, gen),
            gens,
        )
