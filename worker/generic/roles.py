"""What each input of an uncurated definition is, read from its names, dtypes, shapes and descriptions.

- float tensors: activations/weights, swept in scale; those of rank >= 2 not named or described as parameters
  (weight, gamma, beta, bias, an embedding table) are activations: rows of a batch, which real models shift by
  a large per-row offset (the large-offset probe);
- integer tensors that are token ids, indices or targets (by a declared `role`, or by name or
  description), with the axis their values index (`high_axis`: declared, named in the description
  or the constraints, or the one axis whose name says vocabulary/classes/experts/rows);
- scalars: kept at the base workload's value, or tied to an axis when the workload's value equals
  it and the description or constraints say so (`num_embeddings == vocab_size`);
- a pad/ignore scalar (`padding_idx`, `ignore_index`) gives the padding probes their pad id.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field

from worker.formats import Definition, TensorSpec, Workload
from worker.numerics.dtypes import to_torch

Role = Literal["float", "ids", "int", "bool", "scalar"]

_ID_WORDS = re.compile(r"(^|_)(ids?|idx|indices|index|tokens?|targets?|labels?|classes|experts?)($|_)", re.I)
_ID_DESC = re.compile(r"\b(token ids?|indices|index|targets?|labels?|class ids?|expert ids?|vocab\w*)\b", re.I)
_HIGH_WORDS = re.compile(r"vocab|num_embeddings|num_classes|classes|num_experts|experts|num_rows|table", re.I)
_PAD_WORDS = re.compile(r"pad|ignore", re.I)
# a float tensor named or described so is a model parameter, not an activation (w_gate, gamma, "the embedding table")
_PARAM_WORDS = re.compile(r"(^|_)(weights?|w|gamma|beta|bias|table|embeddings?|params?)($|_)", re.I)
_PARAM_DESC = re.compile(r"\b(weights?|gamma|beta|bias|parameters?|embedding table)\b", re.I)


class InputRole(BaseModel):
    name: str
    role: Role
    why: str
    high_axis: str | None = Field(None, description="ids: the axis their values index")
    tied_axis: str | None = Field(None, description="scalars: the axis whose value they must equal")
    activation: bool | None = Field(
        None, description="float tensors: rows of a batch (rank >= 2, not named or described as a parameter)"
    )


def _text(spec: TensorSpec) -> str:
    return (spec.description or "") + " " + " ".join(str(v) for v in (spec.model_extra or {}).values())


def _declared(spec: TensorSpec, key: str) -> Any:
    return (spec.model_extra or {}).get(key)


def _axis_in(text: str, axes: list[str]) -> str | None:
    for axis in sorted(axes, key=len, reverse=True):
        if re.search(rf"\b{re.escape(axis)}\b", text):
            return axis
    return None


def _activation(name: str, spec: TensorSpec) -> tuple[bool, str]:
    """Whether a float tensor holds activations (rows of a batch) rather than parameters, and why: a parameter's
    rows (a weight's output features, a table's entries) do not drift by a shared per-row offset as activations do."""
    if len(spec.shape or []) < 2:
        return False, "rank < 2: a vector or a scalar tensor, not rows of activations"
    if _PARAM_WORDS.search(name):
        return False, "named as a parameter (weight, gamma, beta, bias, table)"
    if _PARAM_DESC.search(spec.description or ""):
        return False, "described as a parameter"
    return True, "activations (rank >= 2, not named or described as a parameter)"


def _high_axis(definition: Definition, name: str, spec: TensorSpec) -> tuple[str | None, str]:
    own = set(spec.shape or [])
    candidates = [a for a in definition.axes if a not in own]
    declared = _declared(spec, "high_axis")
    if isinstance(declared, str) and declared in definition.axes:
        return declared, f"declared high_axis '{declared}'"
    named = _axis_in(spec.description or "", candidates)
    if named:
        return named, f"its description names axis '{named}'"
    for c in definition.constraints:
        if re.search(rf"\b{re.escape(name)}\b", c):
            named = _axis_in(c, candidates)
            if named:
                return named, f"constraint '{c}'"
    worded = [a for a in candidates if _HIGH_WORDS.search(a)]
    if len(worded) == 1:
        return worded[0], f"axis '{worded[0]}' is the only one named like a vocabulary/table size"
    return None, "no axis says what range its values index"


def _tied_axis(
    definition: Definition, name: str, spec: TensorSpec, value: Any, workload_axes: dict[str, int]
) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    text = (
        (spec.description or "")
        + " "
        + " ".join(c for c in definition.constraints if re.search(rf"\b{re.escape(name)}\b", c))
    )
    for axis in sorted(definition.axes, key=len, reverse=True):
        if workload_axes.get(axis) == value and re.search(rf"\b{re.escape(axis)}\b", text):
            return axis
    return None


def classify(definition: Definition, base: Workload) -> dict[str, InputRole]:
    """Each input's role, with the reason; `base` is the workload the probes start from."""
    axes = (
        definition.resolve_axes({a: base.axes[a] for a in definition.var_axes if a in base.axes})
        if all(a in base.axes for a in definition.var_axes)
        else dict(base.axes)
    )
    roles: dict[str, InputRole] = {}
    for name, spec in definition.inputs.items():
        dtype = to_torch(spec.dtype)
        if spec.is_scalar:
            w = base.inputs.get(name)
            value = getattr(w, "value", None)
            tied = _tied_axis(definition, name, spec, value, axes)
            roles[name] = InputRole(
                name=name,
                role="scalar",
                why="scalar argument" + (f", equal to axis '{tied}'" if tied else ""),
                tied_axis=tied,
            )
        elif dtype.is_floating_point:
            act, how = _activation(name, spec)
            roles[name] = InputRole(name=name, role="float", why=f"{spec.dtype} tensor, {how}", activation=act)
        elif dtype == torch.bool:
            roles[name] = InputRole(name=name, role="bool", why="bool tensor (mask): made as the workload makes it")
        else:
            declared = _declared(spec, "role")
            looks = (
                declared in ("token_ids", "ids", "indices", "targets")
                or bool(_ID_WORDS.search(name))
                or bool(_ID_DESC.search(_text(spec)))
            )
            if not looks:
                roles[name] = InputRole(
                    name=name,
                    role="int",
                    why="integer tensor not named or described as ids: made as the workload makes it",
                )
                continue
            high, how = _high_axis(definition, name, spec)
            if high is None:
                roles[name] = InputRole(
                    name=name, role="int", why=f"looks like ids but {how}: made as the workload makes it"
                )
            else:
                roles[name] = InputRole(
                    name=name,
                    role="ids",
                    why=f"ids by {'declaration' if declared else 'name/description'}; range from {how}",
                    high_axis=high,
                )
    return roles


def pad_scalar(definition: Definition, base: Workload) -> tuple[str, int] | None:
    """A pad/ignore scalar and its base value (e.g. padding_idx = 0, ignore_index = -100)."""
    for name, spec in definition.inputs.items():
        if spec.is_scalar and _PAD_WORDS.search(name) and not to_torch(spec.dtype).is_floating_point:
            value = getattr(base.inputs.get(name), "value", None)
            if isinstance(value, int) and not isinstance(value, bool):
                return name, value
    return None
