"""Run comparison: two selections (run, method) side by side, for example the same run under two
estimators, or one estimator on two runs (before and after a change to the trainer)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import drift_charts
from dashboard.queries import Filters
from dashboard.views import decision
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


def side_by_side(headline: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Rows: the statistics of the metric; columns: each selection, then B / A where both have a value and
    A's is not 0, as text (a statistic a selection lacks, such as quantiles under a step range, reads n/a)."""
    stats = ["n", "mean", "min", "p50", "p90", "p99", "max"]
    values = {
        name: frame.iloc[0][stats].astype(float) if len(frame) else pd.Series(float("nan"), index=stats)
        for name, frame in headline.items()
    }
    table = pd.DataFrame(values)
    a, b = table.iloc[:, 0], table.iloc[:, 1]
    shown = table.map(lambda v: "n/a" if pd.isna(v) else f"{v:.4g}")
    shown.loc["n"] = table.loc["n"].map(lambda v: "n/a" if pd.isna(v) else f"{int(v):,}")
    shown["B / A"] = [
        "n/a" if pd.isna(x) or pd.isna(y) else "n/a (A is 0)" if x == 0 else f"{y / x:.4g}"
        for x, y in zip(a, b, strict=True)
    ]
    return shown


def _decisions(ctx: Context, names: dict[str, tuple[str, str]]) -> None:
    """The decision figures of each selection, with their 95% intervals and safe staleness."""
    st.subheader("Decision figures")
    frames = {
        name: load(ctx.db, "decision", Filters((run,), (method,), ctx.filters.staleness, ctx.filters.steps),
                   decision.tolerance())
        for name, (run, method) in names.items()
    }  # fmt: skip
    rows = {name: frame for name, frame in frames.items() if len(frame)}
    if not rows:
        st.info("Neither selection has decision figures (ground_truth has none; estimators need prox_logp).")
        return
    frame = pd.concat(rows, names=["selection"]).reset_index("selection").drop(columns="method")
    table = decision.decision_table(frame.rename(columns={"selection": "method"})).rename_axis("selection")
    st.caption(
        "Intervals: 95%, a bootstrap over steps (over the whole run: none under a step or staleness range). "
        "Safe staleness at the tolerance of the Overview."
    )
    decision.show_table(table)


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
    st.dataframe(side_by_side(headline), width="stretch")
    _decisions(ctx, names)
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
