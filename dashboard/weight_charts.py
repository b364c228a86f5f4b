"""The importance weight charts: box-like glyphs per staleness built from the stored statistics (the
store keeps min, p50, p90, p99, max and the mean, not the lower quartiles), methods side by side, with
the PPO clip range and the behaviour weight bound U drawn, and the weight diagnostics by staleness."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard.charts import (
    LEGEND_BELOW,
    color,
    empty_figure,
    has_quantiles,
    label,
    ordered,
    rgba,
    shared_titles,
    y_scale,
)
from evaluator.formulas.loss import Loss


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


GLYPH_KEY = (
    ("whisker: min..max", dict(mode="lines", line=dict(color="#888", width=1))),
    ("bar: p50..p99", dict(mode="lines", line=dict(color="rgba(136,136,136,0.45)", width=8))),
    ("ticks: p50, p90", dict(mode="markers", marker=dict(symbol="line-ew-open", size=10, color="#888"))),
    ("diamond: mean", dict(mode="markers", marker=dict(symbol="diamond", size=6, color="#888"))),
)


def _glyph_key(fig: go.Figure, quantiles: bool) -> None:
    """Legend entries at the top (in grey, drawing nothing): what each glyph in the methods' colours shows."""
    for name, style in GLYPH_KEY if quantiles else (GLYPH_KEY[0], GLYPH_KEY[3]):
        fig.add_trace(go.Scatter(x=[None], y=[None], name=name, legendrank=1, hoverinfo="skip", **style))


def _corner_note(fig: go.Figure, text: str, hue: str) -> None:
    fig.add_annotation(
        text=text, xref="paper", yref="paper", x=1, y=1.06, showarrow=False, font_color=hue, xanchor="right"
    )


def weight_ranges(frame: pd.DataFrame, metric: str, loss: Loss) -> go.Figure:
    """Distributions of a weight (`behave_imp_weight` or `importance_weight`) per staleness, the methods
    side by side at each staleness (ground truth first), with the clip range [1 - eps_low, 1 + eps_high]
    or the bounds of the store's loss's token-level ratio rules drawn (log y: weights are ratios)."""
    methods = ordered(frame["method"])
    if not methods:
        return empty_figure(f"no {metric} rows for this selection")
    fig, width = go.Figure(), 0.8 / len(methods)
    for i, method in enumerate(methods):
        part = frame[frame["method"] == method].sort_values("staleness")
        offset = (i - (len(methods) - 1) / 2) * width
        _range_glyphs(fig, part, part["staleness"] + offset, method, color(method))
    _glyph_key(fig, has_quantiles(frame))
    if metric == "importance_weight" and loss.has_clip:
        lo, hi = 1 - loss.eps_low, 1 + loss.eps_high
        fig.add_hrect(y0=lo, y1=hi, fillcolor="green", opacity=0.08, line_width=0, layer="below")
        for edge in (lo, hi):
            fig.add_hline(y=edge, line=dict(color="green", dash="dash", width=1))
        _corner_note(fig, f"clip range [{lo:g}, {hi:g}]", "green")
    token_ratio_rules = [r for r in loss.rules if (r.level, r.statistic) == ("token", "ratio")]
    if metric == "behave_imp_weight" and token_ratio_rules:
        for rule in token_ratio_rules:
            for edge in (e for e in (rule.lower, rule.upper) if e is not None):
                fig.add_hline(y=edge, line=dict(color="red", dash="dash", width=1))
        _corner_note(fig, "; ".join(r.describe() for r in token_ratio_rules), "red")
    fig.update_layout(height=520, margin=dict(t=40, b=40), legend=LEGEND_BELOW)
    fig.update_xaxes(title_text=label("staleness"), dtick=1, showgrid=False)
    fig.update_yaxes(title_text=label(metric))
    return y_scale(fig, True)


DIAGNOSTICS = ("ess_fraction", "chi2", "kl_k3")


def weight_diagnostics(frame: pd.DataFrame) -> go.Figure:
    """ESS fraction, chi2 and the KL estimator k3 of the behaviour weights against staleness, one line per
    method (ground truth: the true weights)."""
    methods = ordered(frame["method"])
    if not methods:
        return empty_figure("no behaviour weights for this selection")
    fig = make_subplots(
        rows=1, cols=3, subplot_titles=DIAGNOSTICS, horizontal_spacing=0.07, **shared_titles("staleness")
    )
    for col, name in enumerate(DIAGNOSTICS, start=1):
        for method in methods:
            part = frame[frame["method"] == method].sort_values("staleness")
            fig.add_trace(
                go.Scatter(
                    x=part["staleness"],
                    y=part[name],
                    mode="lines+markers",
                    name=method,
                    legendgroup=method,
                    showlegend=col == 1,
                    line=dict(color=color(method), width=2 if method == "ground_truth" else 1.5),
                ),
                row=1,
                col=col,
            )
        fig.update_yaxes(title_text=label(name), row=1, col=col)
    fig.update_yaxes(range=ess_range(frame["ess_fraction"]), row=1, col=1)
    fig.update_xaxes(dtick=1)
    return fig.update_layout(height=440, margin=dict(t=50, b=60), legend=LEGEND_BELOW)


def ess_range(ess: pd.Series) -> list[float]:
    """A y range that shows how far the ESS fractions fall below 1 (they sit near it when the weights are
    close to each other): from a little under the lowest to a little over 1, never below 0."""
    lowest = float(ess.min()) if ess.notna().any() else 0.0
    span = max(1.0 - lowest, 0.01)
    return [max(0.0, lowest - 0.15 * span), 1.0 + 0.05 * span]
