"""Plotly figures for the submission page, built from what the probes and canary stages stored.

Each function takes a stage's metrics/evidence (JSON from stage_results) and returns a figure as a plain dict
(`plotly.graph_objects.Figure.to_plotly_json()`), or None when the stage stored nothing to plot. The page draws
them with the plotly.js that ships inside the `plotly` package (served at /static/plotly.min.js)."""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go

_LAYOUT = dict(
    template="plotly_white", height=360, margin=dict(l=60, r=20, t=50, b=50), legend=dict(orientation="h", y=-0.25)
)


def _num(x: Any) -> float | None:
    """Stored floats: non-finite ones were written as strings ('inf', 'nan') by app.core.jsonsafe."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _figure(fig: go.Figure) -> dict[str, Any]:
    out: dict[str, Any] = fig.to_plotly_json()
    return out


def probe_errors(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """Per output: the error ratio (kernel error / ideal output's error) against index multiplicity or reduction
    length, one trace per probe, with the budget as a dashed line. One figure per (output, kind of bucket)."""
    series: dict[tuple[str, str], list[tuple[str, list[float], list[float], float]]] = {}
    for probe, pm in (metrics.get("probes") or {}).items():
        for output, om in (pm.get("outputs") or {}).items():
            kind = str(om.get("bucket_kind") or "")
            xs, ys = [], []
            for b in om.get("buckets") or []:
                x, y = _num(b.get("mean_label")) or _num(b.get("lo")), _num(b.get("ratio"))
                # an exact bucket (ratio 0, e.g. rows with one contribution) has no place on a log axis
                if x is not None and y is not None and y > 0 and b.get("groups", 0):
                    xs.append(x)
                    ys.append(y)
            if xs:
                pts = sorted(zip(xs, ys))
                series.setdefault((output, kind), []).append(
                    (probe, [p[0] for p in pts], [p[1] for p in pts], _num(om.get("max_ratio")) or 0.0)
                )
    figures = []
    for (output, kind), traces in series.items():
        by = "index multiplicity" if kind.startswith("index_count") else "reduction length"
        fig = go.Figure()
        for probe, xs, ys, _ in traces:
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=probe))
        budget = max(t[3] for t in traces)
        lo, hi = min(min(t[1]) for t in traces), max(max(t[1]) for t in traces)
        fig.add_trace(
            go.Scatter(
                x=[lo, hi],
                y=[budget, budget],
                mode="lines",
                name=f"budget {budget:g}x",
                line=dict(dash="dash", color="crimson"),
            )
        )
        fig.update_layout(
            title=f"{output}: error ratio vs {by}",
            xaxis=dict(title=by, type="log"),
            yaxis=dict(title="error / ideal output's error", type="log"),
            **_LAYOUT,
        )
        figures.append(_figure(fig))
    return figures


def _opt_floats(values: Any) -> list[float | None]:
    return [_num(v) for v in values] if isinstance(values, list) else []


def canary_losses(evidence: dict[str, Any]) -> list[dict[str, Any]]:
    """Per optimiser: the held-out loss gap (submission - reference, the number the canary judges) at each
    checkpoint, drawn against what it is judged by: the null band (+-B, the largest mean gap of the reference's own
    rerun and one-ulp runs) shaded, each null run's gaps in grey, the limit (max(k B, floor)) dashed, and the mean
    gap. The gap is drawn on its own, not as two loss curves that lie on top of each other. Hovering a point gives
    both losses."""
    figures = []
    for opt, curve in (evidence.get("curves") or {}).items():
        h = curve.get("heldout") or {}
        steps = h.get("checkpoints") or []
        ref, sub = _opt_floats(h.get("reference")), _opt_floats(h.get("submission"))
        if not steps or not ref:
            continue
        gap = _opt_floats(h.get("gap")) or [
            s - r if s is not None and r is not None else None for s, r in zip(sub, ref)
        ]
        band, limit = _num(h.get("band")) or 0.0, _num(h.get("threshold")) or 0.0
        mean = _num(h.get("mean_gap"))
        nulls = [_opt_floats(g) for g in h.get("null_gaps") or [] if isinstance(g, list)]
        fig = go.Figure()
        x_span = [min(steps), max(steps)]
        if band > 0:
            fig.add_trace(
                go.Scatter(
                    x=x_span, y=[band, band], mode="lines", line=dict(width=0), showlegend=False, hoverinfo="skip"
                )
            )
            fig.add_trace(
                go.Scatter(
                    x=x_span,
                    y=[-band, -band],
                    mode="lines",
                    line=dict(width=0),
                    fill="tonexty",
                    fillcolor="rgba(110,119,129,0.22)",
                    name=f"null band ±{band:.4g} (the reference's own noise)",
                    hoverinfo="skip",
                )
            )
        for i, g in enumerate(nulls):
            fig.add_trace(
                go.Scatter(
                    x=steps,
                    y=g,
                    mode="lines",
                    line=dict(color="rgba(110,119,129,0.7)", width=1, dash="dot"),
                    name="null runs' gaps",
                    legendgroup="nulls",
                    showlegend=i == 0,
                    hovertemplate="null run " + str(i + 1) + ": %{y:+.4g}<extra></extra>",
                )
            )
        fig.add_trace(
            go.Scatter(
                x=x_span,
                y=[limit, limit],
                mode="lines",
                line=dict(dash="dash", color="crimson", width=2),
                name=f"limit +{limit:.4g} (fails above)",
                hovertemplate="limit %{y:+.4g}<extra></extra>",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=steps,
                y=gap,
                mode="lines+markers",
                name="submission - reference",
                line=dict(color="#0969da", width=3),
                customdata=[[r, s] for r, s in zip(ref, sub)],
                hovertemplate="step %{x}: gap %{y:+.4g}<br>reference %{customdata[0]:.5g}, submission %{customdata[1]:.5g}<extra></extra>",
            )
        )
        if mean is not None:
            fig.add_trace(
                go.Scatter(
                    x=x_span,
                    y=[mean, mean],
                    mode="lines",
                    line=dict(color="#0969da", width=1, dash="dot"),
                    name=f"mean gap {mean:+.4g} (judged)",
                    hovertemplate="mean gap %{y:+.4g}<extra></extra>",
                )
            )
        # a scale on which the limit, the band and every gap are visible, centred on zero
        seen = [abs(v) for v in [*gap, *(v for g in nulls for v in g)] if v is not None]
        reach = max([limit, band, *seen, 1e-6]) * 1.25
        missing = [st for st, g in zip(steps, gap) if g is None]
        title = f"canary ({opt}): held-out loss gap, submission - reference"
        if missing:
            title += f" (not finite at step {', '.join(str(m) for m in missing)})"
        fig.update_layout(
            title=title,
            xaxis=dict(title="training step"),
            yaxis=dict(
                title="loss gap (nats): worse is up",
                range=[-reach, reach],
                zeroline=True,
                zerolinecolor="#8c959f",
                tickformat="+.2g",
            ),
            **_LAYOUT,
        )
        figures.append(_figure(fig))
    return figures


_BUCKET_COLOURS = ("#0969da", "#8250df", "#1a7f37", "#bc4c00", "#0a3069")


def _bucket_order(label: str) -> tuple[int, float]:
    """Buckets in numeric order of their fewest contributions per row: '0', '1', '2-7', '8-63', ..., '>=4096';
    'all' (an output not bucketed by rows) first."""
    if label == "all":
        return (0, 0.0)
    digits = "".join(c if c.isdigit() else " " for c in label).split()
    return (1, float(digits[0])) if digits else (2, 0.0)


def _ratio_ticks(lo: float, hi: float) -> list[float]:
    ticks = []
    for decade in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        ticks += [m * 10.0**decade for m in (1, 2, 5)]
    return [t for t in ticks if lo <= t <= hi]


def gradient_fidelity(evidence: dict[str, Any], budgets: dict[str, Any]) -> dict[str, Any] | None:
    """The canary's gradient fidelity: the worst error ratio over the checked steps per bucket of rows (by
    contributions per row, in numeric order), per output, against each output's budget (dashed). The ratio axis is
    logarithmic and spans only the values and budgets shown, labelled in multiples of the ideal error; an exact
    bucket (ratio 0) sits on the axis' floor marked 'exact', a non-finite one at its top marked 'inf'. Bars over
    their output's budget are red."""
    rows = [r for r in evidence.get("fidelity") or [] if isinstance(r, dict) and "output" in r and "bucket" in r]
    if not rows:
        return None
    outputs = list(dict.fromkeys(str(r["output"]) for r in rows))
    order = sorted(dict.fromkeys(str(r["bucket"]) for r in rows), key=_bucket_order)
    limits = {o: _num((budgets.get(o) or {}).get("max_ratio")) for o in outputs}
    finite = [v for v in (_num(r.get("ratio")) for r in rows) if v is not None and v > 0]
    values = finite + [b for b in limits.values() if b is not None and b > 0] + [1.0]
    lo, hi = min(values) / 2, max(values) * 2
    fig = go.Figure()
    for i, output in enumerate(outputs):
        mine = sorted((r for r in rows if str(r["output"]) == output), key=lambda r: _bucket_order(str(r["bucket"])))
        budget = limits[output]
        ys, texts, colours = [], [], []
        for r in mine:
            raw = r.get("ratio")
            v = _num(raw)
            if v is None and str(raw).lower() in ("inf", "infinity", "nan"):
                ys.append(hi)
                texts.append("inf")
            elif v is None or v <= 0:
                ys.append(lo)
                texts.append("exact")
            else:
                ys.append(v)
                texts.append(f"{v:.3g}x")
            over = budget is not None and ((v is None and texts[-1] == "inf") or (v is not None and v > budget))
            colours.append("#cf222e" if over else _BUCKET_COLOURS[i % len(_BUCKET_COLOURS)])
        fig.add_trace(
            go.Bar(
                x=[str(r["bucket"]) for r in mine],
                y=ys,
                name=output,
                text=texts,
                textposition="outside",
                cliponaxis=False,
                marker=dict(color=colours),
                customdata=[[r.get("rows", ""), r.get("step", "")] for r in mine],
                hovertemplate=output
                + ", %{x} contributions per row: %{text}<br>%{customdata[0]} rows, worst at step %{customdata[1]}<extra></extra>",
            )
        )
        if budget is not None and budget > 0:
            # an annotation on a log axis is placed in log10 units (add_hline's would sit at 10**budget and stretch
            # the axis to it): the line and its label are placed separately
            fig.add_hline(y=budget, line=dict(dash="dash", color="crimson"))
            fig.add_annotation(
                x=1,
                xref="paper",
                xanchor="right",
                y=math.log10(budget),
                yref="y",
                yanchor="bottom",
                text=f"{output} budget {budget:g}x",
                showarrow=False,
                font=dict(color="crimson"),
            )
    ticks = _ratio_ticks(lo, hi)
    fig.update_layout(
        title="canary: gradient fidelity, worst error ratio per bucket of rows",
        barmode="group",
        xaxis=dict(title="contributions per row (bucket)", type="category", categoryorder="array", categoryarray=order),
        yaxis=dict(
            title="kernel error / ideal output's error",
            type="log",
            range=[math.log10(lo), math.log10(hi) + 0.15],
            tickvals=ticks,
            ticktext=[f"{t:g}x" for t in ticks],
        ),
        **_LAYOUT,
    )
    return _figure(fig)


def for_stage(
    name: str, metrics: dict[str, Any], evidence: dict[str, Any], budgets: dict[str, Any]
) -> list[dict[str, Any]]:
    if name == "probes":
        return probe_errors(metrics)
    if name == "canary":
        fid = gradient_fidelity(evidence, budgets)
        return canary_losses(evidence) + ([fid] if fid is not None else [])
    return []
