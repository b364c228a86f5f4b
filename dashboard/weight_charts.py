"""The importance weight charts: box-like glyphs per staleness built from the stored statistics (the
store keeps min, p50, p90, p99, max and the mean, not the lower quartiles), methods side by side, with
the PPO clip range and the behaviour weight cap drawn."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboard.charts import color, empty_figure, has_quantiles, label, ordered, rgba, y_scale

CLIP_RANGE = (0.8, 1.2)  # PPO ratio clip [1 - eps, 1 + eps_high] at eps 0.2 (DOMAIN.md section 1)
BEHAVE_WEIGHT_CAP = 5.0  # AReaL's default cap of the behaviour weight exp(prox - behave)


def _segments(x: pd.Series, lo: pd.Series, hi: pd.Series) -> tuple[list, list]:
    """Vertical segments x: lo..hi as one trace (None separates them)."""
    xs, ys = [], []
    for xi, a, b in zip(x, lo, hi, strict=True):
        xs += [xi, xi, None]
        ys += [a, b, None]
    return xs, ys


def _range_glyphs(fig: go.Figure, frame: pd.DataFrame, x: pd.Series, name: str, hue: str) -> None:
    """Box-like glyphs at positions `x` from stored stats: a whisker min..max, a thick bar p50..p99,
    ticks at p50 and p90, a diamond at the mean (whisker and mean only when quantiles are null)."""
    group, quiet = dict(legendgroup=name, showlegend=True), dict(legendgroup=name, showlegend=False)
    xs, ys = _segments(x, frame["min"], frame["max"])
    fig.add_trace(
        go.Scatter(
            x=xs, y=ys, mode="lines", line=dict(color=hue, width=1), name=name, hoverinfo="skip", **group
        )
    )
    if has_quantiles(frame):
        xs, ys = _segments(x, frame["p50"], frame["p99"])
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                line=dict(color=rgba(hue, 0.45), width=8),
                hoverinfo="skip",
                **quiet,
            )
        )
        ticks = pd.concat([frame["p50"], frame["p90"]])
        fig.add_trace(
            go.Scatter(
                x=pd.concat([x, x]),
                y=ticks,
                mode="markers",
                hoverinfo="skip",
                **quiet,
                marker=dict(symbol="line-ew-open", size=10, color=hue, line_width=2),
            )
        )
    stats = [c for c in ("n", "min", "p50", "p90", "p99", "max") if frame[c].notna().any()]
    hover = "<br>".join(f"{c} %{{customdata[{k}]:.4g}}" for k, c in enumerate(stats))
    template = f"{name}<br>staleness %{{text}}<br>mean %{{y:.4g}}<br>{hover}<extra></extra>"
    fig.add_trace(
        go.Scatter(
            x=x,
            y=frame["mean"],
            mode="markers",
            marker=dict(symbol="diamond", size=6, color=hue),
            customdata=frame[stats],
            name=f"{name} mean",
            text=frame["staleness"],
            **quiet,
            hovertemplate=template,
        )
    )


def _corner_note(fig: go.Figure, text: str, hue: str) -> None:
    fig.add_annotation(
        text=text, xref="paper", yref="paper", x=1, y=1.06, showarrow=False, font_color=hue, xanchor="right"
    )


def weight_ranges(frame: pd.DataFrame, metric: str) -> go.Figure:
    """Distributions of a weight (`behave_imp_weight` or `importance_weight`) per staleness, the methods
    side by side at each staleness (ground truth first), with the PPO clip range or the behaviour weight
    cap drawn (log y: weights are ratios)."""
    methods = ordered(frame["method"])
    if not methods:
        return empty_figure(f"no {metric} rows for this selection")
    fig, width = go.Figure(), 0.8 / len(methods)
    for i, method in enumerate(methods):
        part = frame[frame["method"] == method].sort_values("staleness")
        offset = (i - (len(methods) - 1) / 2) * width
        _range_glyphs(fig, part, part["staleness"] + offset, method, color(method))
    if metric == "importance_weight":
        lo, hi = CLIP_RANGE
        fig.add_hrect(y0=lo, y1=hi, fillcolor="green", opacity=0.08, line_width=0, layer="below")
        for bound in CLIP_RANGE:
            fig.add_hline(y=bound, line=dict(color="green", dash="dash", width=1))
        _corner_note(fig, f"clip range [{lo}, {hi}]", "green")
    if metric == "behave_imp_weight":
        fig.add_hline(y=BEHAVE_WEIGHT_CAP, line=dict(color="red", dash="dash", width=1))
        _corner_note(fig, f"behaviour weight cap {BEHAVE_WEIGHT_CAP}", "red")
    fig.update_layout(height=460, margin=dict(t=40, b=40), legend_title_text="method")
    fig.update_xaxes(title_text=label("staleness"), dtick=1, showgrid=False)
    fig.update_yaxes(title_text=label(metric))
    return y_scale(fig, True, decades=False)
