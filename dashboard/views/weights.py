"""Importance weights by staleness: the behaviour weight exp(prox - behave) and the PPO ratio
exp(theta - prox) as the ground truth has them and as each estimator makes them, against the clip
range and the behaviour weight cap."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, weight_charts
from dashboard.views.common import Context, load, show

WEIGHTS = ("behave_imp_weight", "importance_weight")
CAPTIONS = {
    "behave_imp_weight": "exp(approx - behave_logp): the behaviour weight of the store's loss ({loss}). An "
    "estimator whose weights cross a rule's bound where the ground truth's do not drops or truncates tokens "
    "that should count (and the other way round): its bound_flip_rate.",
    "importance_weight": "exp(theta_logp - approx): the ratio the loss clips or gates ({loss}). An estimator "
    "that moves it across the clip range changes which tokens get a gradient: its clip_flip_rate.",
}
DIAGNOSTICS_CAPTION = (
    "ESS fraction (sum w)^2 / (n sum w^2): the share of the tokens the weights w = behave_imp_weight "
    "effectively keep (1: all equal); chi2 = 1 / ESS fraction - 1: their spread; k3 = mean exp(r) - 1 - r "
    "of r = log w: the KL of pi_behave from pi_prox (AReaL's kl_div_dual). ground_truth: the true weights; "
    "an estimator whose curve sits far from it misjudges how off-policy the tokens are."
)


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
    loss = load(ctx.db, "store_loss")
    words = dict(loss=loss.describe())
    st.subheader("Weight diagnostics by staleness")
    st.caption(DIAGNOSTICS_CAPTION)
    show(
        weight_charts.weight_diagnostics(load(ctx.db, "weights_by_staleness", ctx.with_methods(*methods))),
        "ess",
    )
    for metric in WEIGHTS:
        st.subheader(metric)
        st.caption(CAPTIONS[metric].format(**words))
        show(weight_charts.weight_ranges(frame[frame["metric"] == metric], metric, loss), metric)
        with st.expander(f"{metric}: numbers"):
            st.dataframe(weights_table(frame, metric), width="stretch")
