"""Probe axes drawn per audit from ranges around a base workload, so no kernel can be exact only on known shapes.

Every draw comes from the audit's seed (recorded in the evidence). Var axes below MIN_JITTER (heads,
top-k, batch of one) keep their value; const and expr axes follow the definition. A draw is kept only
if every constraint of the definition that reads axes alone still holds (others, naming inputs, are
left to the scalars tied to axes).
"""

from __future__ import annotations

import ast
import math

import torch

from worker.formats import Definition

MIN_JITTER = 8
JITTER = 0.25
TRIES = 12
_ALLOWED = (
    ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Name, ast.Load, ast.Compare, ast.BoolOp,
    ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Div, ast.Mod, ast.Pow, ast.USub,
    ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.And, ast.Or,
)


def _axis_constraints(definition: Definition) -> list[ast.Expression]:
    out = []
    for c in definition.constraints:
        try:
            tree = ast.parse(c, mode="eval")
        except SyntaxError:
            continue
        nodes = list(ast.walk(tree))
        if all(isinstance(n, _ALLOWED) for n in nodes) and all(
            n.id in definition.axes for n in nodes if isinstance(n, ast.Name)
        ):
            out.append(tree)
    return out


def satisfies(definition: Definition, var_axes: dict[str, int]) -> bool:
    try:
        axes = definition.resolve_axes(var_axes)
    except (ValueError, ZeroDivisionError):
        return False
    if any(v <= 0 for v in axes.values()):
        return False
    for tree in _axis_constraints(definition):
        try:
            if not eval(compile(tree, "<constraint>", "eval"), {"__builtins__": {}}, dict(axes)):  # noqa: S307 - checked AST
                return False
        except (ZeroDivisionError, ArithmeticError):
            return False
    return True


def _greedy(definition: Definition, base: dict[str, int], gen: torch.Generator, candidates: dict[str, list[int]]) -> dict[str, int]:
    """Move each axis to the first candidate that keeps the constraints (axes in random order)."""
    current = dict(base)
    names = list(candidates)
    for i in torch.randperm(len(names), generator=gen).tolist():
        axis = names[i]
        for value in candidates[axis]:
            trial = {**current, axis: value}
            if satisfies(definition, trial):
                current = trial
                break
    return current


def jittered(definition: Definition, base: dict[str, int], gen: torch.Generator) -> dict[str, int]:
    """Each var axis >= MIN_JITTER drawn uniformly within +-25% of the base."""
    cands = {}
    for axis, v in base.items():
        if v >= MIN_JITTER:
            lo, hi = max(1, math.floor(v * (1 - JITTER))), math.ceil(v * (1 + JITTER))
            cands[axis] = torch.randint(lo, hi + 1, (TRIES,), generator=gen).tolist()
    return _greedy(definition, base, gen, cands)


def odd(definition: Definition, base: dict[str, int], gen: torch.Generator) -> dict[str, int]:
    """Each var axis >= MIN_JITTER moved to an odd size near its base (no multiple of 16 or 128)."""
    cands = {}
    for axis, v in base.items():
        if v >= MIN_JITTER:
            lo, hi = max(3, math.floor(v * (1 - JITTER))), math.ceil(v * (1 + JITTER))
            drawn = torch.randint(lo, hi + 1, (TRIES,), generator=gen).tolist()
            cands[axis] = [d | 1 for d in drawn]
    return _greedy(definition, base, gen, cands)


def numel_of(definition: Definition, var_axes: dict[str, int]) -> int:
    axes = definition.resolve_axes(var_axes)
    return sum(math.prod(definition.shape_of(s, axes)) for s in definition.inputs.values() if not s.is_scalar)


def long_axis(definition: Definition, base: dict[str, int], axis: str, factor: int, gen: torch.Generator) -> dict[str, int] | None:
    """`axis` made `factor` times longer, other var axes halved (largest first) to keep the inputs' size."""
    if axis not in base:
        return None
    budget = 2 * numel_of(definition, base)
    for _ in range(TRIES):
        length = base[axis] * factor + int(torch.randint(0, max(base[axis] // 4, 1) + 1, (1,), generator=gen))
        trial = {**base, axis: length}
        for _ in range(32):
            if numel_of(definition, trial) <= budget:
                break
            others = [a for a in trial if a != axis and trial[a] >= 2 * MIN_JITTER]
            if not others:
                break
            largest = max(others, key=lambda a: trial[a])
            trial[largest] //= 2
        if numel_of(definition, trial) <= 4 * budget and satisfies(definition, trial):
            return trial
    return None
