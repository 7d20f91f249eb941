"""definition.json: the op, its axes, inputs, outputs and PyTorch reference."""

from __future__ import annotations

import ast
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from worker.formats import expr
from worker.formats.dtypes import DTypeName


class ConstAxis(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["const"]
    value: int
    description: str | None = None


class VarAxis(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["var"]
    description: str | None = None


class ExprAxis(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["expr"]
    expression: str = Field(
        max_length=expr.MAX_EXPRESSION_CHARS,
        description="Python arithmetic over other axis names, e.g. 'num_tokens * 2'",
    )
    description: str | None = None

    @field_validator("expression")
    @classmethod
    def _parses(cls, v: str) -> str:
        expr.check(v)
        return v


Axis = Annotated[ConstAxis | VarAxis | ExprAxis, Field(discriminator="type")]


class TensorSpec(BaseModel):
    """shape: axis names (a list, [] for a 0-d tensor) or null for a scalar argument."""

    model_config = ConfigDict(extra="allow")
    shape: list[str] | None
    dtype: DTypeName
    description: str | None = None

    @property
    def is_scalar(self) -> bool:
        return self.shape is None


class Definition(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str = ""
    op_type: str | None = None
    tags: list[str] = Field(default_factory=list)
    axes: dict[str, Axis]
    inputs: dict[str, TensorSpec] = Field(min_length=1)
    outputs: dict[str, TensorSpec] = Field(min_length=1)
    reference: str = Field(min_length=1, description="PyTorch source defining a global `run`")
    custom_inputs_entrypoint: str | None = None
    constraints: list[str] = Field(default_factory=list)

    @field_validator("description", "tags", "constraints", mode="before")
    @classmethod
    def _null_is_empty(cls, v: object, info: ValidationInfo) -> object:
        # SOL-ExecBench's files write null for an absent description, tag list or constraint list
        if v is None:
            return "" if info.field_name == "description" else []
        return v

    @model_validator(mode="after")
    def _check(self) -> "Definition":
        for group, specs in (("inputs", self.inputs), ("outputs", self.outputs)):
            for tname, spec in specs.items():
                for axis in spec.shape or []:
                    if axis not in self.axes:
                        raise ValueError(f"{group}.{tname}.shape names axis '{axis}', which is not in axes")
        for tname, spec in self.outputs.items():
            if spec.shape is None:
                raise ValueError(f"outputs.{tname}.shape: outputs must be tensors ([] for 0-d), not null")
        try:
            tree = ast.parse(self.reference)
        except SyntaxError as e:
            raise ValueError(f"reference: not valid Python ({e.msg}, line {e.lineno})") from e
        names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        if "run" not in names:
            raise ValueError("reference: must define a global function `run`")
        if self.custom_inputs_entrypoint and self.custom_inputs_entrypoint not in names:
            raise ValueError(
                f"custom_inputs_entrypoint: '{self.custom_inputs_entrypoint}' is not a function in reference"
            )
        return self

    @property
    def var_axes(self) -> list[str]:
        return [k for k, a in self.axes.items() if a.type == "var"]

    def resolve_axes(self, var_values: dict[str, int]) -> dict[str, int]:
        """Values for every axis: const from here, var from the workload, expr evaluated."""
        missing = [a for a in self.var_axes if a not in var_values]
        if missing:
            raise ValueError(f"workload axes: missing values for var axes {missing}")
        values: dict[str, int] = {}
        for name, axis in self.axes.items():
            if axis.type == "const":
                values[name] = axis.value
            elif axis.type == "var":
                values[name] = int(var_values[name])
        for _ in range(len(self.axes)):
            for name, axis in self.axes.items():
                if axis.type == "expr" and name not in values:
                    try:
                        values[name] = int(_eval_expr(axis.expression, values))
                    except NameError:
                        continue
        unresolved = [n for n in self.axes if n not in values]
        if unresolved:
            raise ValueError(f"axes: could not evaluate expr axes {unresolved}")
        return values

    def shape_of(self, spec: TensorSpec, axes: dict[str, int]) -> tuple[int, ...]:
        return tuple(axes[a] for a in spec.shape or [])


def _eval_expr(expression: str, values: dict[str, int]) -> float:
    """An expr axis's value (worker.formats.expr: no `eval`, bounded integers); NameError while it reads an
    axis not resolved yet."""
    try:
        return float(expr.evaluate(expression, values))
    except expr.UnknownName as err:
        raise NameError(err.name) from err
    except (expr.ExpressionError, ZeroDivisionError) as err:
        raise ValueError(f"axis expression '{expression}': {err}") from err
