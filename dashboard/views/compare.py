"""Run comparison: two selections (run, method) side by side, for example the same run under two
estimators, or one estimator on two runs (before and after a change to the trainer)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import drift_charts
from dashboard.queries import Filters
from dashboard.views.common import ERROR_METRICS, Context, choice, load, plain, seed, show

METRICS = ("drift", *ERROR_METRICS, "behave_imp_weight", "importance_weight")


def _selection(ctx: Context, side: str, run_id: str, method: str) -> tuple[str, str]:
    """One side's run and method pickers (seeded from the URL)."""
    runs = list(ctx.runs["run_id"])
    methods = ["ground_truth", *[m for m in ctx.methods if m != "ground_truth"]]
    seed(f"{side}_run", run_id, choice(runs))
    seed(f"{side}_method", method, choice(methods))
    col = st.columns(2)
    return (
        col[0].selectbox(f"{side}: run_id", runs, key=f"{side}_run"),
        col[1].selectbox(f"{side}: method", methods, key=f"{side}_method"),
    )


def _defaults(ctx: Context) -> tuple[tuple[str, str], tuple[str, str]]:
    """Two runs: the same estimator on the selected run and the next; one run: areal vs exact loglinear."""
    runs = list(ctx.runs["run_id"])
    a_method = next(
        (m for m in ("loglinear", *ctx.methods) if m in ctx.methods and m != "ground_truth"), "ground_truth"
    )
    if len(runs) > 1:
        other = runs[(runs.index(ctx.run_id) + 1) % len(runs)]
        return (ctx.run_id, a_method), (other, a_method)
    b_method = "loglinear_exact" if "loglinear_exact" in ctx.methods else a_method
    return (ctx.run_id, a_method), (ctx.run_id, b_method)


def render(ctx: Context) -> None:
    (a_run, a_method), (b_run, b_method) = _defaults(ctx)
    left, right = st.columns(2)
    with left:
        a = _selection(ctx, "A", a_run, a_method)
    with right:
        b = _selection(ctx, "B", b_run, b_method)
    seed("metric", "abs_error", choice(METRICS))
    metric = st.selectbox(
        "metric", METRICS, key="metric", help="drift is the ground truth's (method ground_truth)"
    )
    names = {f"A: {a[0]} / {a[1]}": a, f"B: {b[0]} / {b[1]}": b}
    rest = dict(staleness=ctx.filters.staleness, steps=ctx.filters.steps)
    headline = {
        n: load(ctx.db, "run_headline", Filters((r,), (m,), **rest), (metric,)) for n, (r, m) in names.items()
    }
    for name, frame in headline.items():
        if frame.empty:
            st.info(
                f"{plain(name)}: no {metric} rows (drift is stored under ground_truth only; errors need "
                "prox_logp)."
            )
    table = pd.concat(headline, names=["selection"]).droplevel(1).drop(columns=["metric"])
    if len(table) == 2:
        stats = ["mean", "p50", "p90", "p99", "max"]
        table.loc["B / A"] = table.iloc[1][stats] / table.iloc[0][stats].where(table.iloc[0][stats] != 0)
    st.dataframe(table, width="stretch")
    log_y = st.toggle("log y", value=True)
    st.subheader(f"{metric} against staleness")
    by_stale = {
        n: load(ctx.db, "by_staleness", Filters((r,), (m,), **rest), (metric,)) for n, (r, m) in names.items()
    }
    show(drift_charts.compare(by_stale, "staleness", metric, log_y=log_y), "compare_staleness")
    st.subheader(f"mean {metric} against step")
    by_step = {
        n: load(ctx.db, "by_step", Filters((r,), (m,), **rest), (metric,), False)
        for n, (r, m) in names.items()
    }
    st.caption("Exact mean per step (per-step quantiles of one selection: the Over training page).")
    show(drift_charts.compare(by_step, "step", metric, log_y=log_y, band=False), "compare_steps")
