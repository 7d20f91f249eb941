"""Which axes the reference reduces over, found by perturbing its inputs (fp64; the reference runs where the audit's
reference runs: in the trusted process when curated, in its sandbox when uploaded).

For each float input, one element at a random position is nudged and the fp64 reference re-run.
An output dim whose axis the input shares is *coupled* when outputs change at other positions
along it than the nudged one (softmax, norms, attention: the output mixes values along that axis).
An axis of a float input that no output has is *contracted* (a GEMM's K, embedding tokens).
Reduction axes = coupled or contracted. Each output is judged per vector along the innermost coupled
axis (a softmax row, an attention output row), or per row of its first dim when nothing is coupled.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import BaseModel, Field

from worker.formats import Definition
from worker.generic.promote import run_promoted
from worker.inputs import Case
from worker.reference import ReferenceRunner

NUDGES = 2


class OutputGrouping(BaseModel):
    output: str
    group_dims: list[int]
    coupled: list[str] = Field(default_factory=list, description="axes along which the output mixes values")
    why: str


class Structure(BaseModel):
    reduced_axes: list[str] = Field(default_factory=list)
    outputs: dict[str, OutputGrouping] = Field(default_factory=dict)
    note: str = ""


def _changed(a: list[Any], b: list[Any]) -> list[torch.Tensor | None]:
    out: list[torch.Tensor | None] = []
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape:
            diff = x.double() != y.double()
            both_nan = torch.isnan(x.double()) & torch.isnan(y.double())
            out.append(diff & ~both_nan)
        else:
            out.append(None)
    return out


def infer_structure(definition: Definition, case: Case, seed: int, reference: ReferenceRunner) -> Structure:
    """Coupled and contracted axes of `definition`'s reference on `case` (a small workload); `reference` is the
    audit's own, sandboxed for an uploaded definition (inputs are promoted here, then sent)."""
    fn = reference.run_fn
    args = case.args(definition)
    try:
        base, _, _ = run_promoted(fn, args, torch.float64)
    except Exception as err:  # noqa: BLE001 - then no structure can be read; outputs are judged whole
        return Structure(
            note=f"could not run the promoted reference to read its structure: {type(err).__name__}: {err}"[:300]
        )
    gen = torch.Generator().manual_seed(seed)
    out_names = list(definition.outputs)
    coupled: dict[str, set[str]] = {n: set() for n in out_names}
    float_axes: set[str] = set()
    for pos, spec in enumerate(definition.inputs.values()):
        t = args[pos]
        if spec.is_scalar or not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point or t.numel() == 0:
            continue
        float_axes.update(spec.shape or [])
        for _ in range(NUDGES):
            flat = int(torch.randint(0, t.numel(), (1,), generator=gen))
            index = list(torch.unravel_index(torch.tensor(flat), t.shape)) if t.dim() else []
            nudged = t.double().clone()
            v = float(nudged.reshape(-1)[flat])
            nudged.reshape(-1)[flat] = v + 1e-3 * (abs(v) + 1.0)
            new_args = list(args)
            new_args[pos] = nudged
            try:
                outs, _, _ = run_promoted(fn, new_args, torch.float64)
            except Exception:  # noqa: BLE001 - a nudge the reference rejects tells nothing
                continue
            for oname, ch in zip(out_names, _changed(base, outs)):
                if ch is None or not bool(ch.any()):
                    continue
                where = ch.nonzero()
                for odim, axis in enumerate(definition.outputs[oname].shape or []):
                    if axis not in (spec.shape or []):
                        continue
                    idim = (spec.shape or []).index(axis)
                    if bool((where[:, odim] != int(index[idim])).any()):
                        coupled[oname].add(axis)
    out_axes = {a for s in definition.outputs.values() for a in (s.shape or [])}
    contracted = sorted(float_axes - out_axes)
    groupings = {}
    for oname, spec in definition.outputs.items():
        shape = spec.shape or []
        mixed = [d for d, a in enumerate(shape) if a in coupled[oname]]
        if not shape:
            dims, why = [], "0-d output: one group"
        elif mixed:
            inner = mixed[-1]
            dims = [d for d in range(len(shape)) if d != inner]
            why = (
                f"one group per vector along '{shape[inner]}' (the innermost axis the reference mixes values along; "
                f"mixed: {sorted(coupled[oname])})"
            )
        elif len(shape) >= 2:
            dims, why = [0], f"elementwise in its own axes: grouped by rows of '{shape[0]}'"
        else:
            dims, why = [], "1-D output with no reduction inside it: the whole tensor is one group"
        groupings[oname] = OutputGrouping(output=oname, group_dims=dims, coupled=sorted(coupled[oname]), why=why)
    reduced = sorted({a for c in coupled.values() for a in c} | set(contracted))
    note = (f"reduced over {reduced}" if reduced else "no reduction axis found") + (
        f" (contracted: {contracted})" if contracted else ""
    )
    return Structure(reduced_axes=reduced, outputs=groupings, note=note)
