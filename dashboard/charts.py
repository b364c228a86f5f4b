"""Plotly figures of the dashboard: a DataFrame from `dashboard.queries` in, a figure out.

Axis titles use the names of DOMAIN.md (`staleness`, `step`, `abs_error`, `behave_imp_weight`, ...) with
their units; each method keeps one colour on every chart. Quantile bands come from the stored p50/p90/p99;
where a filter leaves only exact moments (quantile columns null) the band is min..max around the mean.
"""

from __future__ import annotations

import html
import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

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
    "proximal_t": "#8c564b",
}
SERIES_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e")
FACET_COLUMNS = 3
MARKER_POINTS = 100  # longer series are drawn as lines only (markers hide the shape)


def ordered(methods) -> list[str]:
    """Distinct methods in the order of METHOD_COLORS (ground truth, areal, exact, baselines)."""
    rank = {m: i for i, m in enumerate(METHOD_COLORS)}
    return sorted(dict.fromkeys(methods), key=lambda m: (rank.get(m, len(rank)), m))


def y_scale(fig: go.Figure, log_y: bool, decades: bool = True) -> go.Figure:
    """Log y (errors span decades: one labelled tick per power of ten; weights: automatic ticks)."""
    if log_y:
        return fig.update_yaxes(type="log", dtick=1 if decades else None, exponentformat="power")
    return fig.update_yaxes(type="linear")


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
    group, quiet = dict(legendgroup=name, showlegend=legend), dict(legendgroup=name, showlegend=False)
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
                **quiet,
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


def _grid(titles: list[str], height_per_row: int = 300) -> tuple[go.Figure, int]:
    cols = min(len(titles), FACET_COLUMNS)
    rows = math.ceil(len(titles) / cols)
    fig = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=titles,
        shared_yaxes="all",
        horizontal_spacing=0.04,
        vertical_spacing=0.12,
    )
    fig.update_layout(height=80 + rows * height_per_row, margin=dict(t=60, b=40, l=60, r=20))
    return fig, cols


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
    fig, cols = _grid(methods)
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
    fig.update_xaxes(title_text=label(x))
    fig.update_yaxes(title_text=label(metric), col=1)
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
        rows=1, cols=len(pairs), subplot_titles=titles, shared_yaxes=True, horizontal_spacing=0.05
    )
    for i, pair in enumerate(pairs):
        for method in pair:
            add_series(
                fig, frame[frame["method"] == method], "staleness", method, color(method), row=1, col=i + 1
            )
    fig.update_xaxes(title_text=label("staleness"))
    fig.update_yaxes(title_text=label(metric), col=1)
    return y_scale(fig.update_layout(height=380, margin=dict(t=60, b=40)), log_y)


def headline_bars(frame: pd.DataFrame, metric: str) -> go.Figure:
    """Per method, the headline statistics of `metric` (p50/p90/p99 and max, or mean and max)."""
    if frame.empty:
        return empty_figure(f"no {metric} rows for this selection")
    stats = ["p50", "p90", "p99", "max"] if has_quantiles(frame) else ["mean", "max"]
    frame = frame.set_index("method").loc[ordered(frame["method"])].reset_index()
    fig = go.Figure()
    for i, stat in enumerate(stats):
        fig.add_trace(
            go.Bar(
                x=frame["method"],
                y=frame[stat],
                name=stat,
                marker_color=rgba("#1f77b4", 0.35 + 0.65 * i / max(1, len(stats) - 1)),
            )
        )
    fig.update_layout(barmode="group", height=360, margin=dict(t=30, b=40), legend_title_text="stat")
    fig.update_xaxes(title_text="method")
    return y_scale(fig.update_yaxes(title_text=label(metric)), True)


def tokens_by_staleness(frame: pd.DataFrame) -> go.Figure:
    """How many tokens (loss_mask true) each staleness holds, per run."""
    if frame.empty:
        return empty_figure("no tokens for this selection")
    fig = go.Figure()
    for i, (run_id, part) in enumerate(frame.groupby("run_id", sort=True)):
        fig.add_trace(
            go.Bar(
                x=part["staleness"],
                y=part["n_tokens"],
                name=html.escape(run_id),  # data: plotly reads names as HTML
                marker_color=SERIES_COLORS[i % 4],
            )
        )
    fig.update_layout(barmode="group", height=320, margin=dict(t=30, b=40), legend_title_text="run_id")
    fig.update_xaxes(title_text=label("staleness"), dtick=1)
    return fig.update_yaxes(title_text=label("n_tokens"))


def over_steps(frame: pd.DataFrame, metric: str, log_y: bool = True) -> go.Figure:
    """`metric` against step: the mean per method (solid) and the p90 (dotted) when stored."""
    if frame.empty:
        return empty_figure(f"no {metric} rows for this selection")
    fig = go.Figure()
    for method, part in frame.groupby("method", sort=False):
        part = part.sort_values("step")
        fig.add_trace(
            go.Scatter(
                x=part["step"],
                y=part["mean"],
                mode="lines",
                name=f"{method} mean",
                line=dict(color=color(method), width=2),
                legendgroup=method,
            )
        )
        if has_quantiles(part):
            fig.add_trace(
                go.Scatter(
                    x=part["step"],
                    y=part["p90"],
                    mode="lines",
                    name=f"{method} p90",
                    line=dict(color=color(method), width=1, dash="dot"),
                    legendgroup=method,
                )
            )
    fig.update_layout(height=380, margin=dict(t=30, b=40), hovermode="x unified")
    fig.update_xaxes(title_text=label("step"))
    return y_scale(fig.update_yaxes(title_text=label(metric)), log_y)


def step_staleness_heatmap(frame: pd.DataFrame, metric: str, method: str) -> go.Figure:
    """Mean `metric` of one method on the step x staleness grid (empty cells: no tokens there)."""
    part = frame[frame["method"] == method]
    if part.empty:
        return empty_figure(f"no {metric} rows for {method}")
    grid = part.pivot_table(index="staleness", columns="step", values="mean", aggfunc="mean").sort_index()
    fig = go.Figure(
        go.Heatmap(
            z=grid.to_numpy(),
            x=grid.columns,
            y=grid.index,
            colorscale="Viridis",
            colorbar=dict(title=dict(text=f"mean {metric}", side="right")),
            hovertemplate="step %{x}<br>staleness %{y}<br>mean %{z:.4g}<extra></extra>",
        )
    )
    fig.update_layout(height=360, margin=dict(t=40, b=40), title=f"{method}: mean {metric}")
    fig.update_xaxes(title_text=label("step"))
    return fig.update_yaxes(title_text=label("staleness"), dtick=1)


def compare(
    frames: dict[str, pd.DataFrame], x: str, metric: str, log_y: bool = True, band: bool = True
) -> go.Figure:
    """Two (or more) labelled selections overlaid on one axis: `metric` against `x` with bands."""
    fig = go.Figure()
    for i, (name, frame) in enumerate(frames.items()):
        if not frame.empty:  # a run_id is data: plotly reads names as HTML, so escape it
            add_series(fig, frame, x, html.escape(name), SERIES_COLORS[i % len(SERIES_COLORS)], band=band)
    if not fig.data:
        return empty_figure(f"no {metric} rows for these selections")
    fig.update_layout(height=400, margin=dict(t=30, b=40))
    fig.update_xaxes(title_text=label(x))
    return y_scale(fig.update_yaxes(title_text=label(metric)), log_y)


def token_logps(tokens: pd.DataFrame) -> go.Figure:
    """One sequence: every policy's log-prob per `pos` (top) and the versions (bottom), with the
    version segments of the response shaded."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.65, 0.35], vertical_spacing=0.06)
    policies = {
        "behave_logp": "#9467bd",
        "prox_logp": "#333333",
        "theta_logp": "#1f77b4",
        "proximal_t_logp": "#8c564b",
    }
    for column, hue in policies.items():
        if tokens[column].notna().any():
            fig.add_trace(
                go.Scatter(
                    x=tokens["pos"],
                    y=tokens[column],
                    mode="lines+markers",
                    name=column,
                    line=dict(color=hue, width=1.5),
                    marker_size=4,
                ),
                row=1,
                col=1,
            )
    for column, dash in (("behave_version", "solid"), ("proximal_t_version", "dot")):
        if tokens[column].notna().any():
            fig.add_trace(
                go.Scatter(
                    x=tokens["pos"],
                    y=tokens[column],
                    mode="lines",
                    line_shape="hv",
                    name=column,
                    line=dict(dash=dash, width=2),
                ),
                row=2,
                col=1,
            )
    starts = tokens.index[tokens["behave_version"].diff().fillna(1) != 0].tolist() + [len(tokens)]
    for k, (a, b) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        x0, x1 = tokens["pos"].iloc[a] - 0.5, tokens["pos"].iloc[b - 1] + 0.5
        fig.add_vrect(
            x0=x0,
            x1=x1,
            fillcolor=SERIES_COLORS[k % 4],
            opacity=0.07,
            line_width=0,
            annotation_text=f"segment {k}: version {tokens['behave_version'].iloc[a]}",
            annotation_position="top left",
            row=1,
            col=1,
        )
    fig.update_layout(height=560, margin=dict(t=30, b=40), hovermode="x unified")
    fig.update_xaxes(title_text=label("pos"), row=2, col=1)
    fig.update_yaxes(title_text=label("logp"), row=1, col=1)
    return fig.update_yaxes(title_text=label("version"), dtick=1, row=2, col=1)


def figure_by_staleness(
    frame: pd.DataFrame, figure: str, *, limit: float | None = None, limit_name: str = "", log_y: bool = False
) -> go.Figure:
    """One line per method of a derived figure (`decision_*` or `weight_*` view) against staleness, with
    a dashed horizontal `limit` (a tolerance or a bound)."""
    if frame.empty or frame[figure].isna().all():
        return empty_figure(f"no {figure} for this selection (it needs prox_logp)")
    fig = go.Figure()
    for method in ordered(frame["method"]):
        part = frame[frame["method"] == method].sort_values("staleness")
        fig.add_trace(
            go.Scatter(
                x=part["staleness"],
                y=part[figure],
                mode="lines+markers",
                name=method,
                line=dict(color=color(method), width=2),
                customdata=part[["n"]],
                hovertemplate=f"staleness %{{x}}<br>{figure} %{{y:.4g}}<br>n %{{customdata[0]:,}}",
            )
        )
    if limit is not None:
        fig.add_hline(y=limit, line_dash="dash", line_color="#555", annotation_text=limit_name)
    fig.update_layout(height=340, margin=dict(t=30, b=40))
    fig.update_xaxes(title_text=label("staleness"), dtick=1)
    return y_scale(fig.update_yaxes(title_text=label(figure)), log_y, decades=False)


MISMATCH_REFERENCES = {
    "prob_drift": ((0.005, "verl: normal below 0.005"), (0.01, "verl: precision problem above 0.01")),
    "exp_abs_drift": ((1.05, "NeMo-RL: flagged above 1.05"),),
}


def mismatch_floor(frame: pd.DataFrame) -> go.Figure:
    """The engine mismatch floor (staleness 0) against the published reference levels, and the share of
    each staleness's drift that the floor explains."""
    floor = frame[frame["staleness"] == 0]
    if floor.empty:
        return empty_figure("no tokens at staleness 0: the floor cannot be measured")
    titles = ["prob_drift at staleness 0", "exp_abs_drift at staleness 0", "floor_share by staleness"]
    fig = make_subplots(rows=1, cols=3, subplot_titles=titles, horizontal_spacing=0.08)
    for col, metric in enumerate(MISMATCH_REFERENCES, start=1):
        value = float(floor[metric].iloc[0])
        fig.add_trace(go.Bar(x=["floor"], y=[value], marker_color="#555", showlegend=False), row=1, col=col)
        for y, text in MISMATCH_REFERENCES[metric]:
            fig.add_hline(y=y, line_dash="dash", annotation_text=text, row=1, col=col)
    fig.add_trace(
        go.Bar(x=frame["staleness"], y=frame["floor_share"], marker_color="#1f77b4", showlegend=False),
        row=1,
        col=3,
    )
    fig.update_yaxes(title_text=label("prob_drift"), row=1, col=1)
    top = max(1.08, 1.02 * float(floor["exp_abs_drift"].iloc[0]))  # the 1.05 line stays in view
    fig.update_yaxes(title_text=label("exp_abs_drift"), range=[0.99, top], row=1, col=2)
    fig.update_yaxes(title_text="share", tickformat=".0%", row=1, col=3)
    fig.update_xaxes(title_text=label("staleness"), dtick=1, row=1, col=3)
    return fig.update_layout(height=340, margin=dict(t=50, b=40))
