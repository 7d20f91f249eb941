"""Probe axes drawn per audit from ranges around a base workload, so no kernel can be exact only on known shapes.

Every draw comes from the audit's seed (recorded in the evidence). Var axes below MIN_JITTER (heads,
top-k, batch of one) keep their value; const and expr axes follow the definition. A draw is kept only
if every constraint of the definition that reads axes alone still holds (others, naming inputs, are
left to the scalars tied to axes).
"""

from __future__ import annotations

import math

import torch

from worker.formats import Definition, expr

MIN_JITTER = 8
JITTER = 0.25
TRIES = 12


def _axis_constraints(definition: Definition) -> list[str]:
    """The constraints that read axes alone (others name inputs and are left to the scalars tied to axes)."""
    out = []
    for c in definition.constraints:
        try:
            if expr.names(c) <= set(definition.axes):
                out.append(c)
        except expr.ExpressionError:
            continue
    return out


def satisfies(definition: Definition, var_axes: dict[str, int]) -> bool:
    try:
        axes = definition.resolve_axes(var_axes)
    except (ValueError, ZeroDivisionError):
        return False
    if any(v <= 0 for v in axes.values()):
        return False
    for c in _axis_constraints(definition):
        try:
            if not expr.evaluate(c, axes):
                return False
        except (expr.ExpressionError, ArithmeticError):
            return False
    return True


def _greedy(
    definition: Definition, base: dict[str, int], gen: torch.Generator, candidates: dict[str, list[int]]
) -> dict[str, int]:
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


# the inputs of one probe, summed, at most (2 GiB per fp64 copy): each probe computes the fp64 oracle, the reference
# at its own dtypes and two reordered re-runs, and the largest workloads (a 131,072 x 4,096 score matrix, 16k tokens
# of 32k logits: 4 GiB per fp64 copy) ran an 80 GB card out of memory two audits at once, their fp64 measurements
# then moved to the host at 30-50 s a probe (benchmarks/results/h100-2026-12-07-second)
PROBE_MAX_NUMEL = 2**28


def within_numel(
    definition: Definition, var_axes: dict[str, int], cap: int | None = None, keep: tuple[str, ...] = ()
) -> dict[str, int]:
    """`var_axes` with its largest axes halved, those not in `keep` only, until the inputs hold at most `cap`
    elements (or nothing more can be halved within the constraints). `keep`: the reduced axes, whose length is what
    a low-precision accumulator's error grows with; the others (rows, tokens, heads) only repeat the same
    computation, and the benchmark stage has run every workload at its full size already."""
    cap = PROBE_MAX_NUMEL if cap is None else cap
    trial, size = dict(var_axes), numel_of(definition, var_axes)
    while size > cap:
        options = sorted((a for a in trial if a not in keep and trial[a] >= 2 * MIN_JITTER), key=lambda a: -trial[a])
        halved = ({**trial, a: trial[a] // 2} for a in options)
        smaller = next((c for c in halved if numel_of(definition, c) < size and satisfies(definition, c)), None)
        if smaller is None:
            break
        trial, size = smaller, numel_of(definition, smaller)
    return trial


def long_axis(
    definition: Definition,
    base: dict[str, int],
    axis: str,
    factor: int,
    gen: torch.Generator,
    keep: tuple[str, ...] = (),
    cap: int | None = None,
) -> dict[str, int] | None:
    """`axis` made `factor` times longer, other var axes halved (those not in `keep` first, largest first) to
    keep the inputs within 4x their base size, and within `cap` unless the base is larger already (then
    within the base's size: the reduction longer, the rows fewer)."""
    if axis not in base:
        return None
    cap = PROBE_MAX_NUMEL if cap is None else cap
    size = numel_of(definition, base)
    budget = max(size, min(4 * size, cap))
    limit = max(budget, min(2 * budget, cap))  # when halving cannot reach the budget
    for _ in range(TRIES):
        length = base[axis] * factor + int(torch.randint(0, max(base[axis] // 4, 1) + 1, (1,), generator=gen))
        trial = {**base, axis: length}
        for _ in range(32):
            if numel_of(definition, trial) <= budget:
                break
            others = [a for a in trial if a != axis and trial[a] >= 2 * MIN_JITTER]
            if not others:
                break
            largest = max(others, key=lambda a: (a not in keep, trial[a]))
            trial[largest] //= 2
        if numel_of(definition, trial) <= limit and satisfies(definition, trial):
            return trial
    return None


DIVISOR_CAP = 4  # jitter keeps divisibility by up to 2**4 = 16


def _two_adic(v: int, cap: int = DIVISOR_CAP) -> int:
    j = 0
    while j < cap and v % (2 ** (j + 1)) == 0:
        j += 1
    return j


def jitter_bounds(v: int) -> tuple[int, int]:
    """The smallest and largest size `jittered_keeping_divisibility` can draw for an axis of size `v`."""
    if v < MIN_JITTER:
        return v, v
    step = 2 ** _two_adic(v)
    lo, hi = math.ceil(v * (1 - JITTER) / step), math.floor(v * (1 + JITTER) / step)
    return max(lo, 1) * step, hi * step


def jittered_keeping_divisibility(
    definition: Definition, var_axes: dict[str, int], gen: torch.Generator
) -> dict[str, int]:
    """Each var axis >= MIN_JITTER within +-25%, with the same power of two dividing it (up to 16).

    A multiple of 16 stays a multiple of 16 and an odd size stays odd, so a probe keeps what it was written
    for (aligned or not) while its exact sizes change from audit to audit.
    """
    cands = {}
    for axis, v in var_axes.items():
        if v < MIN_JITTER:
            continue
        j = _two_adic(v)
        step = 2**j
        lo, hi = (b // step for b in jitter_bounds(v))
        exact = j < DIVISOR_CAP  # below the cap the quotient must stay odd, so the power of two is exactly the same
        options = [q * step for q in range(lo, hi + 1) if not exact or q % 2 == 1]
        if options:
            picks = torch.randint(0, len(options), (TRIES,), generator=gen).tolist()
            cands[axis] = [options[i] for i in picks]
    return _greedy(definition, var_axes, gen, cands)


FREE_AXIS_TARGET = 2**20  # a 1M-token context: positions where fp32 index arithmetic (pos * inv_freq) loses precision


def free_axes(definition: Definition, var_axes: dict[str, int]) -> list[str]:
    """The var axes that size no input or output tensor (not even through an expr axis): they reach the inputs only
    through a workload's custom generator or the constraints (`positions < max_position`), so the scale and shape
    probes never move them far, and whatever they bound (positions, offsets) stays at the benchmark's sizes."""
    tensors = [*definition.inputs.values(), *definition.outputs.values()]
    tensors = [s for s in tensors if not s.is_scalar]
    try:
        axes = definition.resolve_axes(var_axes)
    except (ValueError, ZeroDivisionError):
        return []
    shapes = [definition.shape_of(s, axes) for s in tensors]
    free = []
    for axis, v in var_axes.items():
        try:  # doubled: a shape that depends on the axis changes (an expr axis too), whatever divides it
            moved = definition.resolve_axes({**var_axes, axis: 2 * v})
        except (ValueError, ZeroDivisionError):
            continue
        if [definition.shape_of(s, moved) for s in tensors] == shapes:
            free.append(axis)
    return free


def large_free_axis(
    definition: Definition, var_axes: dict[str, int], axis: str, gen: torch.Generator, target: int = FREE_AXIS_TARGET
) -> dict[str, int] | None:
    """`var_axes` with the free `axis` drawn in [3/4, 1] x `target` (or, where the constraints forbid it, halved
    until they allow it); None when nothing above the axis's own value in `var_axes` satisfies them. The other axes
    are kept: a free axis sizes no tensor, so the inputs cost what they did."""
    base = var_axes[axis]
    value = target - int(torch.randint(0, target // 4 + 1, (1,), generator=gen))
    while value > base:
        trial = {**var_axes, axis: value}
        if satisfies(definition, trial):
            return trial
        value //= 2
    return None
