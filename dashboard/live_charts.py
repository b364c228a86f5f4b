"""The live page's figure: a run's decision over the store's commits, the gated figure it rests on with its
95% interval at each commit, its bound dashed, each point coloured by the decision then."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from evaluator.verdict import ACTIONS

ACTION_COLORS = {"do_not_ship": "#d62728", "undecided": "#7f7f7f", "ship_up_to": "#ff7f0e", "ship": "#2ca02c"}


def decision_history(frame: pd.DataFrame) -> go.Figure:
    """`frame`: one row per commit (`live_queries.history_row`). x: the commit's snapshot id."""
    fig = go.Figure()
    for action in ACTIONS:
        rows = frame[(frame["action"] == action) & frame["value"].notna()]
        if rows.empty:
            continue
        fig.add_trace(
            go.Scatter(
                x=rows["snapshot_id"], y=rows["value"], mode="markers", name=action,
                marker=dict(color=ACTION_COLORS[action], size=9),
                error_y=dict(
                    type="data", symmetric=False, array=rows["upper"] - rows["value"],
                    arrayminus=rows["value"] - rows["lower"],
                ),
                customdata=rows[["max_staleness", "where"]],
                hovertemplate="commit %{x}: %{y:.4g}<br>max staleness %{customdata[0]} %{customdata[1]}",
            )
        )  # fmt: skip
    measured = frame[frame["value"].notna()]
    fig.add_trace(
        go.Scatter(
            x=measured["snapshot_id"], y=measured["value"], mode="lines", line=dict(color="#bbbbbb", width=1),
            showlegend=False, hoverinfo="skip",
        )
    )  # fmt: skip
    bounds = frame["bound"].dropna()
    if not bounds.empty:
        fig.add_hline(y=float(bounds.iloc[-1]), line_dash="dash", annotation_text="bound")
    figure = frame["figure"].dropna()
    fig.update_layout(
        xaxis_title="commit (the store's snapshot id)",
        yaxis_title=str(figure.iloc[-1]) if not figure.empty else "gated figure",
        legend_title="decision",
        height=380,
        margin=dict(t=30),
    )
    return fig
