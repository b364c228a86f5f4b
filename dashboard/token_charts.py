"""The token inspector's figure: one sequence's log-probs under each policy and the chosen estimates, by
`pos`, each estimate's error against `prox_logp`, and the versions."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard.charts import SERIES_COLORS, color, label

POLICIES = {
    "behave_logp": "#9467bd",
    "prox_logp": "#333333",
    "theta_logp": "#1f77b4",
    "proximal_t_logp": "#8c564b",
}
ROWS = {"logp": 1, "error": 2, "version": 3}


def _line(x: pd.Series, y: pd.Series, name: str, **style) -> go.Scatter:
    return go.Scatter(x=x, y=y, name=name, hovertemplate=f"{name} %{{y:.4g}}<extra></extra>", **style)


def _segments(fig: go.Figure, tokens: pd.DataFrame) -> list[str]:
    """Shade each version segment of the response (abort-resume) on every row and label it `v<version>` at
    the top, the labels of neighbouring segments on two alternating lines so that short segments do not
    overlap; returns each segment's description."""
    starts = tokens.index[tokens["behave_version"].diff().fillna(1) != 0].tolist() + [len(tokens)]
    described = []
    for k, (a, b) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        first, last = tokens["pos"].iloc[a], tokens["pos"].iloc[b - 1]
        version = tokens["behave_version"].iloc[a]
        shade = dict(fillcolor=SERIES_COLORS[k % 4], opacity=0.07, line_width=0)
        fig.add_vrect(x0=first - 0.5, x1=last + 0.5, row="all", col=1, **shade)
        place = dict(xref="x", yref="paper", yanchor="bottom", showarrow=False, font=dict(size=10))
        fig.add_annotation(x=(first + last) / 2, y=1.0 if k % 2 == 0 else 0.975, text=f"v{version}", **place)
        described.append(f"segment {k}: pos {first}..{last}, behave_version {version}")
    return described


def token_logps(
    tokens: pd.DataFrame, estimates: pd.DataFrame, methods: list[str]
) -> tuple[go.Figure, list[str]]:
    """One sequence (`tokens` sorted by pos): every policy's log-prob and the `methods`' estimates per `pos`
    (top), each estimate's error `estimate - prox_logp` (middle, where the token has `prox_logp`) and the
    versions (bottom), with the version segments shaded; and the segments described in words."""
    tokens = tokens.reset_index(drop=True)
    fig = make_subplots(
        rows=3, cols=1, shared_xaxes=True, row_heights=[0.5, 0.25, 0.25], vertical_spacing=0.05
    )
    for column, hue in POLICIES.items():
        if tokens[column].notna().any():
            style = dict(mode="lines+markers", line=dict(color=hue, width=1.5), marker_size=4)
            fig.add_trace(_line(tokens["pos"], tokens[column], column, **style), row=ROWS["logp"], col=1)
    for method in methods:
        part = estimates[estimates["method"] == method]
        dashed = dict(
            mode="lines", line=dict(color=color(method), width=1.5, dash="dash"), legendgroup=method
        )
        fig.add_trace(_line(part["pos"], part["estimate"], f"{method} (estimate)", **dashed), row=1, col=1)
        if part["error"].notna().any():
            solid = dict(mode="lines+markers", line=dict(color=color(method), width=1.5), marker_size=4)
            error = _line(part["pos"], part["error"], f"{method} - prox_logp", legendgroup=method, **solid)
            fig.add_trace(error, row=ROWS["error"], col=1)
    fig.add_hline(y=0, line=dict(color="#999", width=1), row=ROWS["error"], col=1)
    for column, dash in (("behave_version", "solid"), ("proximal_t_version", "dot")):
        if tokens[column].notna().any():
            style = dict(mode="lines", line_shape="hv", line=dict(dash=dash, width=2))
            fig.add_trace(_line(tokens["pos"], tokens[column], column, **style), row=ROWS["version"], col=1)
    described = _segments(fig, tokens)
    fig.update_layout(height=720, margin=dict(t=40, b=40), hovermode="x unified")
    fig.update_xaxes(title_text=label("pos"), row=ROWS["version"], col=1)
    fig.update_yaxes(title_text=label("logp"), row=ROWS["logp"], col=1)
    fig.update_yaxes(title_text="estimate - prox_logp (nats)", row=ROWS["error"], col=1)
    return fig.update_yaxes(title_text=label("version"), dtick=1, row=ROWS["version"], col=1), described
