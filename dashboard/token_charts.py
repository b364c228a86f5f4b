"""The token inspector's figure: one sequence's log-probs under each policy, by `pos`."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard.charts import SERIES_COLORS, label


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
