"""Turn probe outcomes and check results into diagnoses a kernel author can act on.

The key pattern: error that grows with index multiplicity (rows summing more
contributions) or with reduction length, while the ideal error stays flat, is the
signature of a low-precision accumulator. The accumulator's precision is estimated
from the worst bucket: zero-mean terms summed in an accumulator with unit roundoff u
give a relative error of about 0.29 * u * sqrt(k) (bf16: 1.15e-3 * sqrt(k), docs/design.md).
"""

from __future__ import annotations

import math
from typing import Any

from worker.numerics.checks import CheckResult
from worker.numerics.error_metrics import BucketError, OutputError
from worker.probes.outcome import ProbeOutcome

RANDOM_WALK_COEFF = 0.29
BF16_U, FP16_U = 2.0**-8, 2.0**-11
# the worst bucket must be this many times worse than the least-summed one to call it growth
GROWTH = 3.0


def accumulator_guess(rel_err: float, k: float) -> str:
    """Name the accumulator precision that explains `rel_err` over sums of about `k` terms."""
    if k <= 1 or rel_err <= 0:
        return "low-precision accumulation"
    u_est = rel_err / (RANDOM_WALK_COEFF * math.sqrt(k))
    if u_est >= BF16_U / math.sqrt(8):
        return "a bf16 accumulator: every add rounded to bf16"
    if u_est >= FP16_U / math.sqrt(8):
        return "partial sums rounded to bf16 (e.g. bf16 partials of fp32 block sums) or an fp16 accumulator"
    return "partial sums rounded to a low precision during the reduction"


def _grows(buckets: list[BucketError], max_ratio: float) -> bool:
    if len(buckets) < 2:
        return False
    top = buckets[-1]
    # one contribution is exact for any accumulator: compare with the lowest bucket that sums something
    low = next((b for b in buckets if b.lo >= 2), buckets[0])
    if top is low or top.ratio <= max_ratio or top.ratio < GROWTH * max(low.ratio, 1.0):
        return False
    running = 0.0
    for b in buckets:
        if b.ratio < 0.5 * running:
            return False
        running = max(running, b.ratio)
    return True


def _multiplicity(outcomes: list[ProbeOutcome]) -> tuple[ProbeOutcome, OutputError, list[BucketError], int] | None:
    hits: list[tuple[ProbeOutcome, OutputError, list[BucketError]]] = []
    for o in outcomes:
        for out in o.outputs:
            if out.bucket_kind is None or not out.bucket_kind.startswith("index_count"):
                continue
            populated = [b for b in out.buckets if b.lo >= 1 and b.groups > 0]
            if _grows(populated, out.max_ratio):
                hits.append((o, out, populated))
    if not hits:
        return None
    # prefer a realistic distribution over an adversarial one, then the widest range of multiplicities
    best = max(hits, key=lambda h: (not h[0].adversarial, len(h[2]), h[2][-1].ratio))
    return (*best, len(hits))


def _fmt_bucket(b: BucketError) -> str:
    label = b.label.replace(">=", ">= ")
    noun = "contribution" if b.label == "1" else "contributions"
    return f"rows with {label} {noun} at {b.rel_err:.2%} vs {b.ideal_rel_err:.2%} ideal ({b.ratio:.1f}x)"


def multiplicity_diagnosis(outcomes: list[ProbeOutcome]) -> str | None:
    found = _multiplicity(outcomes)
    if found is None:
        return None
    o, out, buckets, n_probes = found
    top = buckets[-1]
    # the lowest bucket that sums anything (one contribution is exact for any accumulator)
    low = next((b for b in buckets if b.lo >= 2), buckets[0])
    between = [b for b in buckets if low.lo < b.lo < top.lo]
    middle = between[len(between) // 2] if between else None
    parts = (
        [_fmt_bucket(top)] + ([_fmt_bucket(middle)] if middle else []) + ([_fmt_bucket(low)] if low is not top else [])
    )
    guess = accumulator_guess(top.rel_err, top.mean_label)
    return (
        f"error grows with index multiplicity ('{out.output}', probe '{o.name}'"
        f"{f' and {n_probes - 1} other(s)' if n_probes > 1 else ''}): "
        + "; ".join(parts)
        + f"; consistent with low-precision accumulation ({guess}): accumulate in fp32 and round once at the end"
    )


def reduction_length_diagnosis(outcomes: list[ProbeOutcome]) -> str | None:
    points: dict[str, list[tuple[int, float, float, float, str, float]]] = {}
    for o in outcomes:
        for out in o.outputs:
            if out.bucket_kind is None or not out.bucket_kind.startswith("reduction_length") or not out.buckets:
                continue
            b = out.buckets[0]
            points.setdefault(f"{out.output}|{out.bucket_kind}", []).append(
                (b.lo, b.ratio, b.rel_err, b.ideal_rel_err, o.name, out.max_ratio)
            )
    for key, pts in points.items():
        lengths = sorted({p[0] for p in pts})
        if len(lengths) < 2:
            continue
        by_len = {L: max((p for p in pts if p[0] == L), key=lambda p: p[1]) for L in lengths}
        longest, shortest = by_len[lengths[-1]], by_len[lengths[0]]
        if longest[1] > longest[5] and longest[1] >= GROWTH * max(shortest[1], 1.0):
            output, kind = key.split("|")
            axis = kind.split(":", 1)[-1]
            guess = accumulator_guess(longest[2], longest[0])
            return (
                f"error grows with reduction length ('{output}' over {axis}): {axis}={longest[0]} at {longest[2]:.2%} vs "
                f"{longest[3]:.2%} ideal ({longest[1]:.1f}x, probe '{longest[4]}'); {axis}={shortest[0]} at {shortest[2]:.2%} vs "
                f"{shortest[3]:.2%} ideal ({shortest[1]:.1f}x); consistent with low-precision accumulation ({guess}): "
                "keep partial sums in fp32"
            )
    return None


def _scalar_name(example: list[int], scalars: dict[str, Any]) -> str:
    if len(example) != 1:
        return ""
    names = [n for n, v in scalars.items() if isinstance(v, int) and not isinstance(v, bool) and v == example[0]]
    return f" (= {names[0]})" if names else ""


def zero_group_diagnosis(outcomes: list[ProbeOutcome]) -> str | None:
    for o in outcomes:
        for out in o.outputs:
            if out.zero_groups_nonzero:
                scalars = o.input_stats.get("scalars", {})
                ex = out.zero_group_examples[0] if out.zero_group_examples else []
                return (
                    f"'{out.output}' is not zero in {out.zero_groups_nonzero} of {out.zero_groups} groups that nothing contributes to "
                    f"(probe '{o.name}', e.g. group {ex}{_scalar_name(ex, scalars)}): rows no input reaches and the padding row "
                    "must be exactly 0"
                )
    return None


def nonfinite_diagnosis(outcomes: list[ProbeOutcome]) -> str | None:
    for o in outcomes:
        for out in o.outputs:
            if out.nonfinite:
                return f"'{out.output}' has {out.nonfinite} NaN/Inf elements where the fp64 oracle is finite (probe '{o.name}': {o.why})"
    return None


def budget_diagnoses(outcomes: list[ProbeOutcome]) -> list[str]:
    lines = []
    for o in outcomes:
        if o.kernel_error:
            nc = f" (non-contiguous inputs {o.noncontiguous})" if o.noncontiguous else ""
            hint = ""
            if "exit code -11" in o.kernel_error or "exit code -7" in o.kernel_error:
                hint = " (a memory fault: check bounds masks for these sizes" + (
                    " and that strides are honoured for non-contiguous inputs)" if o.noncontiguous else ")"
                )
            lines.append(f"the kernel failed on probe '{o.name}'{nc} ({o.why}): {o.kernel_error}{hint}")
            continue
        for out in o.outputs:
            if out.mismatches:
                lines.append(f"'{out.output}' differs from the oracle in {out.mismatches} elements (probe '{o.name}')")
            elif out.worst_ratio > out.max_ratio:
                label = ""
                if out.worst_group_label is not None and out.bucket_kind:
                    kind, _, what = out.bucket_kind.partition(":")
                    label = (
                        f", {out.worst_group_label} contributions"
                        if kind == "index_count"
                        else f", {what}={out.worst_group_label}"
                    )
                lines.append(
                    f"'{out.output}' error is {out.worst_ratio:.1f}x the ideal output's in group {out.worst_group}{label} "
                    f"(budget {out.max_ratio:g}x) on probe '{o.name}' ({o.why}); whole tensor {out.rel_err:.2e} vs "
                    f"{out.ideal_rel_err:.2e} ideal"
                )
    return lines


def diagnose(outcomes: list[ProbeOutcome], checks: list[CheckResult]) -> list[str]:
    """Most specific first: verdict.py shows the first."""
    failed = {c.name: c for c in checks if not c.passed}
    lines: list[str] = []
    for name in ("outputs_written", "inputs_unmodified"):
        if name in failed:
            lines.append(failed[name].summary)
    accumulation = [d for d in (multiplicity_diagnosis(outcomes), reduction_length_diagnosis(outcomes)) if d]
    lines.extend(accumulation)
    if "determinism" in failed:
        s = failed["determinism"].summary
        if accumulation:
            s += "; consistent with atomics adding in a varying order into a low-precision accumulator"
        lines.append(s)
    if "outputs_written" not in failed:
        d = nonfinite_diagnosis(outcomes)
        if d:
            lines.append(d)
    d = zero_group_diagnosis(outcomes)
    if d:
        lines.append(d)
    if "order_invariance" in failed:
        s = failed["order_invariance"].summary
        if not any("low-precision accumulation" in x for x in lines):
            s += "; consistent with low-precision partial sums whose grouping follows the input order"
        lines.append(s)
    for name, c in failed.items():
        if name not in ("outputs_written", "inputs_unmodified", "determinism", "order_invariance"):
            lines.append(c.summary)
    lines.extend(budget_diagnoses(outcomes))
    return lines
