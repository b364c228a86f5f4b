"""Drift by staleness: how far the policy moved since each token was generated (true drift), the engine
mismatch floor under it, and how wrong each estimator is, against staleness; the `areal` and `exact`
version conventions, and each token's own version against AReaL's shipped pairing, side by side."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, drift_charts
from dashboard.views import trainers
from dashboard.views.common import ERROR_METRICS, Context, choice, load, note_missing_ground_truth, seed, show

CONVENTION_PAIRS = (("loglinear", "loglinear_exact"), ("linear", "linear_exact"))
PAIRING_PAIRS = (("loglinear", "loglinear_shipped"), ("linear", "linear_shipped"))
PAIRING_NOTE = (
    "own: each token interpolated with its own version (AReaL's intent). shipped: with the previous token's "
    "version, -1 (no interpolation) on the first token, as AReaL's code does (it rolls log-probs but not "
    "versions). AReaL's own logged loglinear/* and linear/* metrics match the shipped methods."
)
LINEAR_FLOOR_NOTE = (
    "`linear` here is the stable log-add-exp form; AReaL's own adds 1e-10 inside the log and floors at "
    "about -23.03, so the two differ only for tokens with log-prob below about -20."
)


def staleness_table(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Rows staleness, columns (method, stat): the numbers behind the charts."""
    part = frame[frame["metric"] == metric]
    stats = (
        ["n", "mean", "p50", "p90", "p99", "max"]
        if charts.has_quantiles(part)
        else ["n", "mean", "min", "max"]
    )
    return (
        part.pivot_table(index="staleness", columns="method", values=stats)
        .swaplevel(axis=1)
        .sort_index(axis=1)
    )


def render(ctx: Context) -> None:
    note_missing_ground_truth(ctx)
    seed("metric", "abs_error", choice(ERROR_METRICS))
    left, right = st.columns([3, 1])
    metric = left.selectbox(
        "error metric", ERROR_METRICS, key="metric", help="their formulas: docs/metrics.md, 'The metrics'"
    )
    log_y = right.toggle("log y", value=True)
    estimators = ctx.filters.methods
    frame = load(ctx.db, "by_staleness", ctx.with_methods(*estimators, "ground_truth"), (metric, "drift"))
    drift = frame[(frame["method"] == "ground_truth") & (frame["metric"] == "drift")]
    errors = frame[(frame["method"] != "ground_truth") & (frame["metric"] == metric)]
    if ctx.filters.steps is not None:
        st.caption(
            "Step range selected: bands are min..max around the exact mean (quantiles are over all steps)"
        )
    st.subheader("True drift against staleness")
    st.caption(
        "drift = |prox_logp - behave_logp|: what every estimator has to bridge. Bands: p50-p90 and p90-p99."
    )
    show(charts.facets_by_method(drift, "staleness", "drift", log_y=log_y), "drift")
    st.subheader("Engine mismatch floor")
    st.caption(
        "At staleness 0 behave and prox are the same version: what drift remains is the inference engine "
        "against the trainer (precision, kernels, sampling settings), a floor no estimator can remove. "
        "verl's FAQ calls a mean prob_drift below 0.005 normal and above 0.01 a precision problem; NeMo-RL "
        "flags a mean exp_abs_drift above 1.05. floor_share: the floor's share of each staleness's drift."
    )
    show(drift_charts.mismatch_floor(load(ctx.db, "mismatch", ctx.run_id)), "mismatch")
    st.subheader(f"{metric} of each estimator against staleness")
    st.caption("Dashed: the true drift, p50 (mean under a step range): the error of using behave_logp as is.")
    show(charts.facets_by_method(errors, "staleness", metric, reference=drift, log_y=log_y), "errors")
    _pairs(
        ctx,
        metric,
        log_y,
        "Version conventions: areal vs exact",
        CONVENTION_PAIRS,
        ("areal", "exact"),
        "areal: v_prox = step - 1, v_theta = step (what AReaL ships). exact: v_prox = step, "
        "v_theta = step + minibatch / n_minibatches. " + LINEAR_FLOOR_NOTE,
    )
    _pairs(
        ctx, metric, log_y, "Version pairing: own vs AReaL's shipped", PAIRING_PAIRS, ("own", "shipped"),
        PAIRING_NOTE,
    )  # fmt: skip
    st.subheader("Numbers")
    st.dataframe(staleness_table(frame[frame["method"] != "ground_truth"], metric), width="stretch")
    st.dataframe(staleness_table(drift, "drift"), width="stretch")
    trainers.render(ctx)  # after the numbers: each trainer's own figure of the floor above


def _pairs(ctx: Context, metric: str, log_y: bool, title: str, pairs, kinds, caption: str) -> None:
    """One chart of estimator pairs (two variants of each) against staleness, with its caption."""
    st.subheader(title)
    present = tuple(p for p in pairs if all(m in ctx.methods for m in p))
    if not present:
        st.info(f"This run has no rows for the pairs {', '.join(' / '.join(p) for p in pairs)}.")
        return
    st.caption(caption)
    frame = load(ctx.db, "by_staleness", ctx.with_methods(*[m for p in present for m in p]), (metric,))
    show(charts.method_pairs(frame, metric, present, kinds, log_y=log_y), f"pairs_{kinds[1]}")
