"""Build a workload's inputs in the trusted process, fresh for every round."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from worker.formats import Definition, Workload
from worker.numerics.dtypes import to_torch
from worker.reference import Reference


@dataclass(frozen=True)
class Case:
    """One concrete call: inputs in the definition's order and the output shapes."""

    axes: dict[str, int]
    inputs: dict[str, Any]
    output_shapes: dict[str, tuple[int, ...]]

    def args(self, definition: Definition) -> list[Any]:
        return [self.inputs[name] for name in definition.inputs]

    def output_specs(self, definition: Definition) -> list[dict[str, Any]]:
        return [
            {"shape": list(self.output_shapes[n]), "dtype": spec.dtype} for n, spec in definition.outputs.items()
        ]


def random_tensor(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    return torch.randint(0, 128, shape, generator=gen, dtype=torch.int64).to(dtype)


def build_case(
    definition: Definition,
    reference: Reference,
    workload: Workload,
    seed: int,
    *,
    folder: Path | None = None,
) -> Case:
    axes = definition.resolve_axes(workload.axes)
    gen = torch.Generator().manual_seed(seed)
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
                torch.manual_seed(seed)
                custom = reference.custom_inputs({**axes, **scalars}, torch.device("cpu"))
            inputs[name] = custom[name].cpu()
        elif kind == "safetensors":
            from safetensors.torch import load_file

            path = Path(w.path)  # type: ignore[union-attr]
            if folder is not None and not path.is_absolute():
                path = folder / path
            inputs[name] = load_file(str(path))[w.tensor_key]  # type: ignore[union-attr]
        else:
            if spec.is_scalar:
                raise ValueError(f"workload {workload.uuid}: scalar input '{name}' needs a value")
            inputs[name] = random_tensor(definition.shape_of(spec, axes), to_torch(spec.dtype), gen)
    shapes = {n: definition.shape_of(s, axes) for n, s in definition.outputs.items()}
    return Case(axes=axes, inputs=inputs, output_shapes=shapes)
