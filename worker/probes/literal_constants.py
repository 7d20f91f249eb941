"""A small constant written into the reference (an eps) that the kernel's sources do not have, where they have
another: the likely cause of a failure in the regime where that constant matters.

SOL-ExecBench definitions often fix an epsilon in the reference's code (`EPS = 1e-5`) rather than take it as an
input, so the scalar probes (`constant:<input>`) cannot move it; the activation-scale probes reach the regime where
it matters (activations whose squares are of its size) and fail a kernel that hard-codes another one. This names
that cause. It is a reading of two texts, not a measurement: it only adds a diagnosis to a stage that has already
failed on its numbers, and says "consistent with", never decides a verdict.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from worker.generic.spec import SMALL_CONSTANT

# a decimal or scientific literal, with C's optional float suffix; not part of a name or of a longer number
_NUMBER = re.compile(r"(?<![\w.])((?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)[fF]?(?![\w.])")


def small_literals(source: str) -> set[float]:
    """The positive float literals below SMALL_CONSTANT in `source`: eps-sized constants."""
    out = set()
    for m in _NUMBER.finditer(source):
        try:
            v = float(m.group(1))
        except ValueError:
            continue
        if 0.0 < v < SMALL_CONSTANT:
            out.add(v)
    return out


def _has(values: Iterable[float], v: float) -> bool:
    return any(math.isclose(v, w, rel_tol=1e-6) for w in values)


def constant_mismatch(reference: str, kernel_sources: Iterable[str], failed_probes: list[str]) -> str | None:
    """A diagnosis when the reference's eps-sized literals appear in none of the kernel's sources and the kernel has
    eps-sized literals of its own; None otherwise (no such constant, the kernel has it, or it has none to compare)."""
    wanted = small_literals(reference)
    theirs: set[float] = set()
    for src in kernel_sources:
        theirs |= small_literals(src)
    if not wanted or not theirs or any(_has(theirs, v) for v in wanted):
        return None
    ref = ", ".join(f"{v:g}" for v in sorted(wanted))
    kern = ", ".join(f"{v:g}" for v in sorted(theirs))
    where = f" (failing: {', '.join(failed_probes[:3])})" if failed_probes else ""
    return (
        f"the reference's constant {ref} appears nowhere in the kernel's sources, which write {kern}: consistent with "
        f"an epsilon of another size, which changes the output where the activations' squares are that small{where}"
    )
