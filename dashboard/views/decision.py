"""The decision the Overview leads with after its verdict: may I ship this estimator? (docs/metrics.md, "Does
the error matter?")

An error in the estimate of prox reaches the gradient only through PPO's clip and the behaviour-weight
bound, so per method: the share of the gradient mass it moves, the clip and bound decisions it flips, and
the largest staleness at which both stay within the tolerance (the safe staleness), each with its 95%
interval, and beyond the engine floor.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import drift_charts
from dashboard.queries import Tolerance
from dashboard.views.common import Context, load, plain, seed, show
from evaluator.verdict.options import options_for
from schemas.figures import Observed, bounds, shown, with_bounds

COLUMNS = {  # the decisive figures first: a wide table scrolls, and what is off screen goes unread
    "gradient_mass_error": "share of the policy-gradient mass the estimate moves: "
    "sum |W(a) - W(g)| / sum W(g)",
    "excess_gradient_mass_error": "gradient_mass_error minus the engine floor's (rollout at staleness 0)",
    "clip_flip_rate": "share of tokens whose PPO clip decision the estimate flips",
    "bound_flip_rate": "share of tokens whose behaviour-weight bound decision (U) the estimate flips",
    "safe_staleness_beyond_floor": "largest staleness up to which the method's excess over the engine floor "
    "meets the tolerance at every staleness (with enough tokens): what the approximation itself allows",
    "safe_staleness": "largest staleness at which every staleness (with enough tokens) meets the tolerance; "
    "-1: not even staleness 0",
    "clip_active_rate": "share of tokens the estimate clips",
    "true_clip_active_rate": "share of tokens the ground truth clips",
    "n": "tokens with the ground truth (prox_logp)",
}
LEVELS = ("safe_staleness_beyond_floor", "safe_staleness")
INTERVAL = "95% interval: a bootstrap over steps"
LEVEL_INTERVAL = "with 95% confidence .. at most (the tolerance judged on each staleness's interval)"


def tolerance() -> Tolerance:
    """The safe staleness's tolerance as chosen (URL, or the defaults 1%, 1%, 1,000 tokens); the inputs
    are drawn by `tolerance_inputs`, so the verdict above them can use it first."""
    seed("tol_gme", 1.0, float)
    seed("tol_flip", 1.0, float)
    seed("tol_tokens", 1000, int)
    state = st.session_state
    return Tolerance(state["tol_gme"] / 100, state["tol_flip"] / 100, int(state["tol_tokens"]))


def _tolerance_inputs() -> None:
    with st.expander("tolerance of the safe staleness and the engine floor (defaults: 1%, 1%, 1,000 tokens)"):
        cols = st.columns(3)
        cols[0].number_input("max gradient mass error (%)", 0.0, 100.0, step=0.5, key="tol_gme")
        cols[1].number_input("max clip flip rate (%)", 0.0, 100.0, step=0.5, key="tol_flip")
        cols[2].number_input("min tokens per staleness", 0, step=100, key="tol_tokens")


def interval_text(frame: pd.DataFrame, column: str, percent: bool) -> pd.Series:
    """`lower .. upper` of `column` (its interval's columns) as text, empty where there is none."""
    lower, upper = (frame[name] for name in bounds(column))
    display = "percent" if percent else "level"
    return pd.Series(
        [
            f"{shown(a, display)} .. {shown(b, display)}" if pd.notna(a) and pd.notna(b) else ""
            for a, b in zip(lower, upper, strict=True)
        ],
        index=frame.index,
    )


def decision_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per method (in the frame's order): the safe staleness (beyond the floor, absolute) and the decision
    figures, each with its 95% interval as text where the frame has one; a column with no value at all is
    left out."""
    table = frame.set_index("method")
    out = pd.DataFrame(index=table.index)
    for column in COLUMNS:
        if column not in table or table[column].isna().all():
            continue
        out[column] = table[column]
        if bounds(column)[0] in table and table[bounds(column)[0]].notna().any():
            out[f"{column} 95%"] = interval_text(table, column, percent=column not in LEVELS)
    return out


def show_table(table: pd.DataFrame) -> None:
    """A `decision_table` with each column's meaning on hover, rates as percentages."""
    st.dataframe(table, column_config=_config(table), width="stretch")


def _config(table: pd.DataFrame) -> dict:
    config = {}
    for column in table:
        name = column.removesuffix(" 95%")
        if column.endswith(" 95%"):
            config[column] = st.column_config.TextColumn(
                column, help=LEVEL_INTERVAL if name in LEVELS else INTERVAL
            )
        elif name in LEVELS:
            config[column] = st.column_config.NumberColumn(column, help=COLUMNS[name])
        else:
            fmt = "localized" if name == "n" else "percent"
            config[column] = st.column_config.NumberColumn(column, help=COLUMNS[name], format=fmt)
    return config


def _headline(frame: pd.DataFrame, tolerance: Tolerance, minibatches: int | None) -> None:
    """The trainer option closest to the recomputed prox (`reuse_train_logp` only on a run of one
    minibatch per step: AReaL runs it only so; the other methods are measures, no trainer's option)."""
    options = {o.method: o for o in options_for(minibatches)}
    mine = frame[frame["method"].isin(options)]
    if mine.empty:
        return
    best = mine.sort_values("gradient_mass_error").iloc[0]
    safe = best["safe_staleness"]
    where = (
        "no staleness has enough tokens to judge"
        if pd.isna(safe)
        else "not even at staleness 0"
        if safe < 0
        else f"within tolerance up to staleness **{int(safe)}**"
    )
    values = [best.get(c) for c in with_bounds("gradient_mass_error")]
    moved = Observed(*(None if pd.isna(v) else float(v) for v in values), display="percent").format()
    flips = Observed(best["clip_flip_rate"], display="percent").format()
    st.markdown(
        f"Of the methods a trainer runs here, closest to the recomputed prox on this selection: "
        f"**{best['method']}** ({options[best['method']]}), moving **{moved}** of the gradient mass "
        f"and flipping **{flips}** of clip decisions; {where} (tolerance "
        f"{tolerance.max_gradient_mass_error:.1%} mass, {tolerance.max_clip_flip_rate:.1%} clip flips)."
    )


def render(ctx: Context) -> None:
    st.subheader("May I ship this estimator?")
    st.caption(
        "On a token that is neither clipped nor masked, prox cancels out of the gradient: an error in its "
        "estimate matters only where it flips PPO's clip or the behaviour-weight bound (docs/metrics.md, "
        "'Does the error matter?'). Intervals: 95%, a bootstrap over steps."
    )
    tol = tolerance()
    _tolerance_inputs()
    frame = load(ctx.db, "decision", ctx.filters, tol)
    if frame.empty or frame["gradient_mass_error"].isna().all():
        st.info(
            f"Run {plain(ctx.run_id)} has no decision figures: they compare each estimate with the "
            "recomputed prox_logp, which this run did not record (or its advantages are all zero)."
        )
        return
    minibatches = load(ctx.db, "run_minibatches").get(ctx.run_id)
    _headline(frame.dropna(subset=["gradient_mass_error"]), tol, minibatches)
    if ctx.filters.steps is not None or ctx.filters.staleness is not None:
        st.caption("Step or staleness range selected: the figures over it, without intervals (kept per run).")
    show_table(decision_table(frame.sort_values("gradient_mass_error")))
    by_staleness = load(ctx.db, "decision_by_staleness", ctx.filters)
    limits = {"gradient_mass_error": tol.max_gradient_mass_error, "clip_flip_rate": tol.max_clip_flip_rate}
    for column, (figure, limit) in zip(st.columns(2), limits.items(), strict=True):
        with column:
            st.caption(f"{figure} by staleness, with its 95% interval: {COLUMNS[figure]}")
            chart = drift_charts.figure_by_staleness(
                by_staleness, figure, limit=limit, limit_name="tolerance", log_y=True
            )
            show(chart, figure)
