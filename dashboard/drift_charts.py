"""The figures of the pages on drift and error (Overview, Drift, Training, Compare, Decision): a frame of
`dashboard.queries` in, a figure out, drawn with the shared helpers of `dashboard.charts`."""

from __future__ import annotations

import html

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard.charts import (
    SERIES_COLORS,
    add_series,
    color,
    empty_figure,
    has_quantiles,
    label,
    ordered,
    rgba,
    y_scale,
)
from schemas.figures import bounds


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
    """Mean `metric` of one method on the step x staleness grid (empty cells: no tokens there; a step with
    none at all is an empty column)."""
    part = frame[frame["method"] == method]
    if part.empty:
        return empty_figure(f"no {metric} rows for {method}")
    grid = part.pivot_table(index="staleness", columns="step", values="mean", aggfunc="mean").sort_index()
    grid = grid.reindex(columns=range(int(grid.columns.min()), int(grid.columns.max()) + 1))
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


def _interval(part: pd.DataFrame, figure: str) -> dict:
    """Error bars and hover of the 95% interval (`{figure}_lower`, `_upper`) where the frame has one."""
    lower, upper = bounds(figure)
    if lower not in part or part[lower].isna().all():
        return dict(
            customdata=part[["n"]],
            hovertemplate=f"staleness %{{x}}<br>{figure} %{{y:.4g}}<br>n %{{customdata[0]:,}}",
        )
    return dict(
        error_y=dict(type="data", symmetric=False, array=part[upper] - part[figure],
                     arrayminus=part[figure] - part[lower], thickness=1.5, width=4),
        customdata=part[["n", lower, upper]],
        hovertemplate=f"staleness %{{x}}<br>{figure} %{{y:.4g}} (95%: %{{customdata[1]:.4g}} to "
        "%{customdata[2]:.4g})<br>n %{customdata[0]:,}",
    )  # fmt: skip


def figure_by_staleness(
    frame: pd.DataFrame, figure: str, *, limit: float | None = None, limit_name: str = "", log_y: bool = False
) -> go.Figure:
    """One line per method of a derived figure (`decision_*` or `weight_*` view) against staleness, with
    its 95% interval as error bars where the frame has one, and a dashed horizontal `limit` (a tolerance
    or a bound)."""
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
                **_interval(part, figure),
            )
        )
    if limit is not None:  # a trace, not an hline: its name goes into the legend, on a log axis too
        ends = [frame["staleness"].min(), frame["staleness"].max()]
        style = dict(mode="lines", line=dict(color="#555", dash="dash"), hoverinfo="skip")
        fig.add_trace(go.Scatter(x=ends, y=[limit, limit], name=f"{limit_name} {limit:g}", **style))
    fig.update_layout(height=380, margin=dict(t=30, b=60))
    fig.update_xaxes(title_text=label("staleness"), dtick=1)
    return y_scale(fig.update_yaxes(title_text=label(figure)), log_y)


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
