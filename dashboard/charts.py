"""Plotly figures of the dashboard: a DataFrame from `dashboard.queries` in, a figure out.

Axis titles use the names of docs/metrics.md (`staleness`, `step`, `abs_error`, `behave_imp_weight`, ...)
with their units; each method keeps one colour on every chart. Quantile bands come from the stored
p50/p90/p99; where a filter leaves only exact moments (quantile columns null) the band is min..max around
the mean. Log axes label 1-2-5 ticks and show zeros on a bottom row (`dashboard.log_axis`).
"""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard import log_axis

LABELS: dict[str, str] = {
    "staleness": "staleness = step - behave_version (steps)",
    "step": "step",
    "pos": "pos (token index in the response)",
    "version": "policy version",
    "logp": "log-prob (nats)",
    "n_tokens": "tokens (loss_mask true)",
    "approx_logp": "approx_logp (nats)",
    "abs_error": "abs_error = |approx - prox_logp| (nats)",
    "rel_error": "rel_error (fraction of |prox_logp|)",
    "squared_error": "squared_error (nats^2)",
    "drift": "drift = |prox_logp - behave_logp| (nats)",
    "behave_imp_weight": "behave_imp_weight = exp(approx - behave_logp)",
    "behave_imp_weight_abs_error": "behave_imp_weight_abs_error",
    "behave_imp_weight_rel_error": "behave_imp_weight_rel_error (fraction)",
    "importance_weight": "importance_weight = exp(theta_logp - approx)",
    "importance_weight_abs_error": "importance_weight_abs_error",
    "importance_weight_rel_error": "importance_weight_rel_error (fraction)",
    "gradient_mass_error": "gradient_mass_error (share of gradient mass moved)",
    "clip_flip_rate": "clip_flip_rate (share of tokens)",
    "bound_flip_rate": "bound_flip_rate (share of tokens)",
    "ess_fraction": "ess_fraction = (sum w)^2 / (n sum w^2)",
    "chi2": "chi2 = n sum w^2 / (sum w)^2 - 1",
    "kl_k3": "k3 = mean exp(r) - 1 - r (nats)",
    "prob_drift": "prob_drift = |exp(prox) - exp(behave)|",
    "exp_abs_drift": "exp_abs_drift = exp(|prox - behave|)",
    "floor_share": "floor_share = drift at staleness 0 / drift",
}

METHOD_COLORS: dict[str, str] = {
    "ground_truth": "#333333",
    "loglinear": "#1f77b4",
    "linear": "#ff7f0e",
    "loglinear_shipped": "#17becf",
    "linear_shipped": "#bcbd22",
    "loglinear_exact": "#2ca02c",
    "linear_exact": "#d62728",
    "rollout": "#9467bd",
    "reuse_train_logp": "#e377c2",
    "proximal_t": "#8c564b",
}
SERIES_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e")
LEGEND_BELOW = dict(orientation="h", x=0, xanchor="left", y=-0.2, yanchor="top")
"""A legend of many entries (a method each, with the glyph key) in rows under the plot: beside it, a
column of entries taller than the chart is cut off."""
FACET_COLUMNS = 3
MARKER_POINTS = 100  # longer series are drawn as lines only (markers hide the shape)


def ordered(methods) -> list[str]:
    """Distinct methods in the order of METHOD_COLORS (ground truth, areal, exact, baselines)."""
    rank = {m: i for i, m in enumerate(METHOD_COLORS)}
    return sorted(dict.fromkeys(methods), key=lambda m: (rank.get(m, len(rank)), m))


def y_scale(fig: go.Figure, log_y: bool) -> go.Figure:
    """Log y (`log_axis.log_y`: errors span decades, and some are 0) or linear."""
    return log_axis.log_y(fig) if log_y else fig.update_yaxes(type="linear")


def label(name: str) -> str:
    return LABELS.get(name, name)


def color(method: str, i: int = 0) -> str:
    return METHOD_COLORS.get(method, SERIES_COLORS[i % len(SERIES_COLORS)])


def rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def has_quantiles(frame: pd.DataFrame) -> bool:
    return "p50" in frame and frame["p50"].notna().any()


def empty_figure(message: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig.update_layout(height=220)


def _band(fig: go.Figure, x: pd.Series, lo: pd.Series, hi: pd.Series, fill: str, group: str, **pos) -> None:
    """A filled band between `lo` and `hi` along `x` (the lower edge, then a fill to it), in `group`."""
    for y, extra in ((lo, {}), (hi, dict(fill="tonexty", fillcolor=fill))):
        edge = go.Scatter(x=x, y=y, mode="lines", line_width=0, hoverinfo="skip", showlegend=False, **extra)
        fig.add_trace(edge.update(legendgroup=group), **pos)


def add_series(
    fig: go.Figure,
    frame: pd.DataFrame,
    x: str,
    name: str,
    hue: str,
    *,
    legend: bool = True,
    band: bool = True,
    **pos,
) -> None:
    """One series on (x, value): p50 line with p50-p90 and p90-p99 bands and mean markers when the frame
    has quantiles; otherwise the mean line with a min-max band (`band`) or alone."""
    frame = frame.sort_values(x)
    group = dict(legendgroup=name, showlegend=legend)
    dense = len(frame) <= MARKER_POINTS
    if has_quantiles(frame):
        _band(fig, frame[x], frame["p50"], frame["p90"], rgba(hue, 0.30), name, **pos)
        _band(fig, frame[x], frame["p90"], frame["p99"], rgba(hue, 0.12), name, **pos)
        centre, centre_name = frame["p50"], f"{name} p50"
        fig.add_trace(
            go.Scatter(
                x=frame[x],
                y=frame["mean"],
                mode="markers" if dense else "lines",
                line=dict(color=hue, width=1, dash="dot"),
                marker=dict(color=hue, symbol="diamond-open"),
                name=f"{name} mean",
                **group,
            ),
            **pos,
        )
    else:
        if band:
            _band(fig, frame[x], frame["min"], frame["max"], rgba(hue, 0.15), name, **pos)
        centre, centre_name = frame["mean"], f"{name} mean"
    fig.add_trace(
        go.Scatter(
            x=frame[x],
            y=centre,
            mode="lines+markers" if dense else "lines",
            line=dict(color=hue, width=2),
            name=centre_name,
            customdata=frame[["n"]],
            hovertemplate=f"{x} %{{x}}<br>%{{y:.4g}}<br>n %{{customdata[0]:,}}",
            **group,
        ),
        **pos,
    )


def _grid(titles: list[str], x: str, y: str, height_per_row: int = 300) -> tuple[go.Figure, int]:
    """Panels of `titles`, FACET_COLUMNS a row, sharing one title per axis (a title per panel runs into the
    next panel's when the page is narrow)."""
    cols = min(len(titles), FACET_COLUMNS)
    rows = math.ceil(len(titles) / cols)
    fig = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=titles,
        shared_yaxes="all",
        horizontal_spacing=0.04,
        vertical_spacing=0.12,
        **shared_titles(x, y),
    )
    fig.update_layout(height=80 + rows * height_per_row, margin=dict(t=60, b=60, l=80, r=20))
    return fig, cols


def shared_titles(x: str, y: str | None = None) -> dict[str, str]:
    """`make_subplots` arguments: one title under all panels (and one beside them), in docs/metrics.md's
    words."""
    return dict(x_title=label(x), **({"y_title": label(y)} if y else {}))


def facets_by_method(
    frame: pd.DataFrame,
    x: str,
    metric: str,
    *,
    reference: pd.DataFrame | None = None,
    reference_name: str = "drift",
    log_y: bool = True,
) -> go.Figure:
    """Small multiples, one panel per method, of `metric` against `x` with quantile bands; `reference`
    (for example the true drift) is drawn dashed in every panel."""
    methods = ordered(frame["method"])
    if not methods:
        return empty_figure(f"no {metric} rows for this selection")
    fig, cols = _grid(methods, x, metric)
    for i, method in enumerate(methods):
        pos = dict(row=i // cols + 1, col=i % cols + 1)
        add_series(fig, frame[frame["method"] == method], x, method, color(method), **pos)
        if reference is not None and not reference.empty:
            ref = reference.sort_values(x)
            centre = ref["p50"] if has_quantiles(ref) else ref["mean"]
            fig.add_trace(
                go.Scatter(
                    x=ref[x],
                    y=centre,
                    mode="lines",
                    line=dict(color="#555", dash="dash"),
                    name=f"true {reference_name}",
                    legendgroup="reference",
                    showlegend=i == 0,
                ),
                **pos,
            )
    return y_scale(fig, log_y)


def method_pairs(
    frame: pd.DataFrame,
    metric: str,
    pairs: tuple[tuple[str, str], ...],
    kinds: tuple[str, str],
    log_y: bool = True,
) -> go.Figure:
    """Two variants of each estimator side by side, one panel per pair: the `areal` and `exact` version
    conventions, or each token's own version and AReaL's shipped pairing (`kinds` names the two)."""
    titles = [f"{a} ({kinds[0]}) vs {b} ({kinds[1]})" for a, b in pairs]
    fig = make_subplots(
        rows=1,
        cols=len(pairs),
        subplot_titles=titles,
        shared_yaxes=True,
        horizontal_spacing=0.05,
        **shared_titles("staleness", metric),
    )
    for i, pair in enumerate(pairs):
        for method in pair:
            add_series(
                fig, frame[frame["method"] == method], "staleness", method, color(method), row=1, col=i + 1
            )
    return y_scale(fig.update_layout(height=380, margin=dict(t=60, b=60, l=80)), log_y)
