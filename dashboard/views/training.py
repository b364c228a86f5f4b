"""Over training: does the estimators' error grow as the run goes on, and where on the step x staleness
grid does it concentrate?"""

from __future__ import annotations

import streamlit as st

from dashboard import charts, drift_charts
from dashboard.views.common import ERROR_METRICS, Context, choice, load, note_missing_ground_truth, seed, show

MIN_CELL_TOKENS = 30  # fewer tokens make a noisy mean


def blank_cells(ctx: Context, with_prox: list[int]) -> str:
    """Why cells of the heat map are blank: a step holds only the staleness values of its batch, and a
    step without prox_logp has no error (nor true drift) at all."""
    row = ctx.runs.set_index("run_id").loc[ctx.run_id]
    lo, hi = ctx.filters.steps or (int(row["first_step"]), int(row["last_step"]))
    n_steps, n_prox = int(row["n_steps"]), len(with_prox)
    text = (
        "Blank cells have no token with prox_logp (what every error and the true drift need) at that step "
        "and staleness: a step holds only the staleness values its batch had."
    )
    if n_prox < n_steps:
        first = ", ".join(map(str, [s for s in with_prox if lo <= s <= hi][:5]))
        text += (
            f" This run recorded prox_logp on {n_prox} of its {n_steps} steps (the recompute ran on some "
            f"steps only{': ' + first + ', ...' if first else ''}): the other steps' columns are blank."
        )
    return text


def render(ctx: Context) -> None:
    note_missing_ground_truth(ctx)
    seed("metric", "abs_error", choice(ERROR_METRICS))
    left, right = st.columns([3, 1])
    metric = left.selectbox("error metric", ERROR_METRICS, key="metric")
    log_y = right.toggle("log y", value=True)
    st.subheader(f"mean {metric} against step")
    means = load(ctx.db, "by_step", ctx.filters, (metric,), False)
    show(drift_charts.over_steps(means, metric, log_y=log_y), "steps")

    options = ["ground_truth", *ctx.filters.methods]
    seed("focus", options[1] if len(options) > 1 else options[0], choice(options))
    focus = st.selectbox("method in focus", options, key="focus", help="ground_truth shows the true drift")
    focus_metric = "drift" if focus == "ground_truth" else metric
    st.subheader(f"{focus}: {focus_metric} per step")
    if ctx.filters.staleness is not None:
        st.caption(
            "Staleness range selected: min..max around the exact mean (quantiles are over all staleness)."
        )
    else:
        st.caption("Line: p50 per step; bands p50-p90 and p90-p99; mean dotted (diamonds up to 100 steps).")
    frame = load(ctx.db, "by_step", ctx.with_methods(focus), (focus_metric,))
    show(charts.facets_by_method(frame, "step", focus_metric, log_y=log_y), "focus")

    st.subheader(f"{focus}: mean {focus_metric} on the step x staleness grid")
    cells = load(ctx.db, "step_staleness", ctx.with_methods(focus), focus_metric)
    show(drift_charts.step_staleness_heatmap(cells, focus_metric, focus), "heatmap")
    st.caption(blank_cells(ctx, load(ctx.db, "steps_with_prox", ctx.run_id)))
    solid = cells[cells["n"] >= MIN_CELL_TOKENS]
    if not solid.empty:
        worst = solid.loc[solid["mean"].idxmax()]
        st.markdown(
            f"Worst cell with at least {MIN_CELL_TOKENS} tokens: step **{worst['step']}**, staleness "
            f"**{worst['staleness']}**: mean {focus_metric} **{worst['mean']:.4g}** "
            f"over {int(worst['n']):,} tokens."
        )
