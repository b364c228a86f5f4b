"""Importance weights by staleness: the behaviour weight exp(prox - behave) and the PPO ratio
exp(theta - prox) as the ground truth has them and as each estimator makes them, against the clip
range and the behaviour weight cap."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, weight_charts
from dashboard.views.common import Context, load, show

WEIGHTS = ("behave_imp_weight", "importance_weight")
CAP, (CLIP_LO, CLIP_HI) = weight_charts.BEHAVE_WEIGHT_CAP, weight_charts.CLIP_RANGE
CAPTIONS = {
    "behave_imp_weight": f"exp(approx - behave_logp) multiplies each token's loss; AReaL caps or masks "
    f"it above {CAP}. An estimator whose weights cross the cap where the ground truth does not masks "
    "tokens that should count (and the other way round).",
    "importance_weight": f"exp(theta_logp - approx) is clipped to [{CLIP_LO}, {CLIP_HI}] by PPO: an "
    "estimator that moves it across the clip range changes which tokens get a gradient.",
}


def weights_table(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Rows (method, staleness): the stored statistics of one weight."""
    part = frame[frame["metric"] == metric]
    stats = (
        ["n", "min", "p50", "p90", "p99", "max", "mean"]
        if charts.has_quantiles(part)
        else ["n", "min", "mean", "max"]
    )
    return part.set_index(["method", "staleness"])[stats]


def render(ctx: Context) -> None:
    methods = ("ground_truth", *ctx.filters.methods)
    frame = load(ctx.db, "by_staleness", ctx.with_methods(*methods), WEIGHTS)
    order = {m: i for i, m in enumerate(methods)}
    frame = frame.sort_values(
        ["method", "staleness"], key=lambda c: c.map(order) if c.name == "method" else c
    )
    st.caption(
        "Per staleness: thin whisker min..max, thick bar p50..p99, ticks at p50 and p90, diamond at the mean."
        + (" Step range selected: exact min/mean/max only." if ctx.filters.steps is not None else "")
    )
    for metric in WEIGHTS:
        st.subheader(metric)
        st.caption(CAPTIONS[metric])
        show(weight_charts.weight_ranges(frame[frame["metric"] == metric], metric), metric)
        with st.expander(f"{metric}: numbers"):
            st.dataframe(weights_table(frame, metric), width="stretch")
