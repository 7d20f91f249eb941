"""Plotly figures for the submission page, built from what the probes and canary stages stored.

Each function takes a stage's metrics/evidence (JSON from stage_results) and returns a figure as a plain dict
(`plotly.graph_objects.Figure.to_plotly_json()`), or None when the stage stored nothing to plot. The page draws
them with the plotly.js that ships inside the `plotly` package (served at /static/plotly.min.js)."""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go

_LAYOUT = dict(template="plotly_white", height=360, margin=dict(l=60, r=20, t=50, b=50), legend=dict(orientation="h", y=-0.25))


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
                    (probe, [p[0] for p in pts], [p[1] for p in pts], _num(om.get("max_ratio")) or 0.0))
    figures = []
    for (output, kind), traces in series.items():
        by = "index multiplicity" if kind.startswith("index_count") else "reduction length"
        fig = go.Figure()
        for probe, xs, ys, _ in traces:
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=probe))
        budget = max(t[3] for t in traces)
        lo, hi = min(min(t[1]) for t in traces), max(max(t[1]) for t in traces)
        fig.add_trace(go.Scatter(x=[lo, hi], y=[budget, budget], mode="lines", name=f"budget {budget:g}x",
                                 line=dict(dash="dash", color="crimson")))
        fig.update_layout(title=f"{output}: error ratio vs {by}", xaxis=dict(title=by, type="log"),
                          yaxis=dict(title="error / ideal output's error", type="log"), **_LAYOUT)
        figures.append(_figure(fig))
    return figures


def canary_losses(evidence: dict[str, Any]) -> list[dict[str, Any]]:
    """Per optimiser: held-out loss of the reference's and the submission's weights at each checkpoint, with the
    null band (the reference's own rerun/one-ulp noise, +- B) and the limit the submission's gap may not pass."""
    figures = []
    for opt, curve in (evidence.get("curves") or {}).items():
        h = curve.get("heldout") or {}
        steps = h.get("checkpoints") or []
        ref = [_num(v) for v in h.get("reference") or []]
        sub = [_num(v) for v in h.get("submission") or []]
        band, limit = _num(h.get("band")) or 0.0, _num(h.get("threshold")) or 0.0
        if not steps or not ref:
            continue
        fig = go.Figure()
        upper = [r + band if r is not None else None for r in ref]
        lower = [r - band if r is not None else None for r in ref]
        fig.add_trace(go.Scatter(x=steps, y=upper, mode="lines", line=dict(width=0), showlegend=False, hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=steps, y=lower, mode="lines", line=dict(width=0), fill="tonexty",
                                 fillcolor="rgba(100,100,100,0.2)", name=f"null band +-{band:.4f}"))
        fig.add_trace(go.Scatter(x=steps, y=[r + limit if r is not None else None for r in ref], mode="lines",
                                 line=dict(dash="dash", color="crimson"), name=f"limit +{limit:.4f}"))
        fig.add_trace(go.Scatter(x=steps, y=ref, mode="lines+markers", name="reference"))
        fig.add_trace(go.Scatter(x=steps, y=sub, mode="lines+markers", name="submission"))
        fig.update_layout(title=f"canary ({opt}): held-out loss", xaxis=dict(title="training step"),
                          yaxis=dict(title="held-out loss (nats)"), **_LAYOUT)
        figures.append(_figure(fig))
    return figures


def gradient_fidelity(evidence: dict[str, Any], budgets: dict[str, Any]) -> dict[str, Any] | None:
    """The canary's gradient fidelity: worst error ratio per bucket of rows (by contribution count) over the
    checked steps, per output, with each output's budget."""
    rows = [r for r in evidence.get("fidelity") or [] if isinstance(r, dict) and "output" in r and "bucket" in r]
    if not rows:
        return None
    fig = go.Figure()
    for output in dict.fromkeys(r["output"] for r in rows):
        mine = [r for r in rows if r["output"] == output]
        fig.add_trace(go.Bar(x=[str(r["bucket"]) for r in mine], y=[_num(r["ratio"]) for r in mine], name=output,
                             text=[f"{r.get('rows', '')} rows" for r in mine]))
        budget = _num((budgets.get(output) or {}).get("max_ratio"))
        if budget is not None:
            fig.add_hline(y=budget, line=dict(dash="dash", color="crimson"), annotation_text=f"{output} budget {budget:g}x")
    fig.update_layout(title="canary: gradient fidelity per bucket (contributions per row)", barmode="group",
                      xaxis=dict(title="contributions per row", type="category"),
                      yaxis=dict(title="error / ideal output's error", type="log"), **_LAYOUT)
    return _figure(fig)


def for_stage(name: str, metrics: dict[str, Any], evidence: dict[str, Any], budgets: dict[str, Any]) -> list[dict[str, Any]]:
    if name == "probes":
        return probe_errors(metrics)
    if name == "canary":
        fid = gradient_fidelity(evidence, budgets)
        return canary_losses(evidence) + ([fid] if fid is not None else [])
    return []
