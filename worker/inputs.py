"""Build a workload's inputs in the trusted process, fresh for every round."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from worker import generated
from worker.formats import Definition, Workload
from worker.numerics.dtypes import to_torch
from worker.reference import ReferenceRunner


@dataclass(frozen=True)
class Recipe:
    """A "random" input not made yet: worker.generated makes it from the seed on whichever side needs it."""

    seed: int
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def make(self, device: torch.device | str) -> torch.Tensor:
        return generated.make(self.seed, self.shape, self.dtype, device)


@dataclass
class Case:
    """One concrete call: inputs in the definition's order and the output shapes.

    Inputs of kind "random" are `Recipe`s until first asked for; `args` makes them on `device` (once), and
    `wire_args` sends the recipes themselves, for the sandbox child to make on its own device."""

    axes: dict[str, int]
    inputs: dict[str, Any]
    output_shapes: dict[str, tuple[int, ...]]
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def __post_init__(self) -> None:
        self._recipes = {n: v for n, v in self.inputs.items() if isinstance(v, Recipe)}

    def _made(self, name: str) -> Any:
        value = self.inputs[name]
        if isinstance(value, Recipe):
            value = self.inputs[name] = value.make(self.device)
        return value

    def release(self) -> None:
        """Drop the tensors made from recipes (the recipes stay): a checked timing set of 1 GiB is not kept."""
        self.inputs.update(self._recipes)

    def args(self, definition: Definition) -> list[Any]:
        return [self._made(name) for name in definition.inputs]

    def recipes(self, definition: Definition) -> dict[int, Recipe]:
        """Position -> recipe, for the inputs not made yet."""
        return {i: v for i, v in enumerate(self.inputs[n] for n in definition.inputs) if isinstance(v, Recipe)}

    def wire_args(self, definition: Definition) -> list[Any]:
        """The arguments as a request carries them: recipes for inputs not made yet, values for the rest."""
        out = []
        for name in definition.inputs:
            v = self.inputs[name]
            out.append(generated.wire(v.seed, v.shape, v.dtype) if isinstance(v, Recipe) else v)
        return out

    def nbytes(self, definition: Definition) -> int:
        return sum(
            v.nbytes if isinstance(v, Recipe) else v.nbytes if isinstance(v, torch.Tensor) else 0
            for v in (self.inputs[n] for n in definition.inputs)
        )

    def output_specs(self, definition: Definition) -> list[dict[str, Any]]:
        return [{"shape": list(self.output_shapes[n]), "dtype": spec.dtype} for n, spec in definition.outputs.items()]


class MissingInputFile(FileNotFoundError):
    """A workload names a safetensors file that is not there."""


def input_seed(seed: int, name: str) -> int:
    """Each random input's own seed, so that any one can be made alone, on either side."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "big") >> 2


def _custom_value(value: Any, scalar: bool) -> Any:
    """A custom input as the kernel gets it: a scalar input (shape null) is a Python number even where the
    definition's make_inputs returned a one-element tensor, as for a workload's own scalars (a Triton kernel takes
    a number, not a pointer); a tensor input comes to the CPU, where the audit places it."""
    if scalar:
        return value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value
    return value.cpu()


def build_case(
    definition: Definition,
    reference: ReferenceRunner,
    workload: Workload,
    seed: int,
    *,
    folder: Path | None = None,
    device: torch.device | str = "cpu",
    lazy: bool = False,
) -> Case:
    """The workload's inputs for one call, on `device`; with `lazy`, random inputs stay recipes until `Case.args`
    makes them (or `Case.wire_args` sends them as recipes)."""
    axes = definition.resolve_axes(workload.axes)
    scalars = {n: w.value for n, w in workload.inputs.items() if w.type == "scalar"}
    inputs: dict[str, Any] = {}
    custom: dict[str, torch.Tensor] | None = None
    for name, spec in definition.inputs.items():
        w = workload.inputs.get(name)
        kind = w.type if w is not None else "random"
        if kind == "scalar":
            inputs[name] = scalars[name]
        elif kind == "custom":
            if custom is None:
                custom = reference.custom_inputs({**axes, **scalars}, torch.device("cpu"), seed)
            inputs[name] = _custom_value(custom[name], spec.is_scalar)
        elif kind == "safetensors":
            from safetensors.torch import load_file

            path = Path(w.path)  # type: ignore[union-attr]
            if folder is not None and not path.is_absolute():
                path = folder / path
            if not path.is_file():
                raise MissingInputFile(
                    f"missing input file '{w.path}' for input '{name}' of workload "  # type: ignore[union-attr]
                    f"{workload.uuid}: the problem's data is incomplete (not the kernel's fault)"
                )
            inputs[name] = load_file(str(path))[w.tensor_key]  # type: ignore[union-attr]
        else:
            if spec.is_scalar:
                raise ValueError(f"workload {workload.uuid}: scalar input '{name}' needs a value")
            inputs[name] = Recipe(input_seed(seed, name), definition.shape_of(spec, axes), to_torch(spec.dtype))
    shapes = {n: definition.shape_of(s, axes) for n, s in definition.outputs.items()}
    case = Case(axes=axes, inputs=inputs, output_shapes=shapes, device=torch.device(device))
    if not lazy:
        case.args(definition)
    return case
