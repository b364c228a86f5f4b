"""The decision the Overview leads with: may I ship this estimator? (DOMAIN.md 3b)

An error in the estimate of prox reaches the gradient only through PPO's clip and the behaviour-weight
bound, so per method: the share of the gradient mass it moves, the clip and bound decisions it flips, and
the largest staleness at which both stay within the tolerance (the safe staleness).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import drift_charts
from dashboard.queries import Tolerance
from dashboard.views.common import Context, load, plain, seed, show

COLUMNS = {
    "safe_staleness": "largest staleness at which every staleness (with enough tokens) meets the tolerance; "
    "-1: not even staleness 0",
    "gradient_mass_error": "share of the policy-gradient mass the estimate moves: "
    "sum |W(a) - W(g)| / sum W(g)",
    "clip_flip_rate": "share of tokens whose PPO clip decision the estimate flips",
    "bound_flip_rate": "share of tokens whose behaviour-weight bound decision (U) the estimate flips",
    "clip_active_rate": "share of tokens the estimate clips (true_clip_active_rate: the ground truth's)",
    "n": "tokens with the ground truth (prox_logp)",
}


def _tolerance() -> Tolerance:
    """The safe staleness's tolerance, chosen in an expander (and kept in the URL)."""
    with st.expander("tolerance of the safe staleness (defaults: 1%, 1%, 1,000 tokens)"):
        cols = st.columns(3)
        seed("tol_gme", 1.0, float)
        seed("tol_flip", 1.0, float)
        seed("tol_tokens", 1000, int)
        gme = cols[0].number_input("max gradient mass error (%)", 0.0, 100.0, step=0.5, key="tol_gme")
        flip = cols[1].number_input("max clip flip rate (%)", 0.0, 100.0, step=0.5, key="tol_flip")
        tokens = cols[2].number_input("min tokens per staleness", 0, step=100, key="tol_tokens")
    return Tolerance(gme / 100, flip / 100, int(tokens))


def _table(frame: pd.DataFrame) -> None:
    table = frame.set_index("method")[
        ["safe_staleness", "gradient_mass_error", "clip_flip_rate", "bound_flip_rate", "clip_active_rate",
         "true_clip_active_rate", "n"]
    ].sort_values("gradient_mass_error")  # fmt: skip
    percent = {c: st.column_config.NumberColumn(c, help=COLUMNS.get(c), format="percent") for c in table}
    config = percent | {
        "safe_staleness": st.column_config.NumberColumn("safe_staleness", help=COLUMNS["safe_staleness"]),
        "n": st.column_config.NumberColumn("n", help=COLUMNS["n"], format="localized"),
        "true_clip_active_rate": st.column_config.NumberColumn(
            "true_clip_active_rate", help=COLUMNS["clip_active_rate"], format="percent"
        ),
    }
    st.dataframe(table, column_config=config, width="stretch")


def _headline(frame: pd.DataFrame, tolerance: Tolerance) -> None:
    best = frame.sort_values("gradient_mass_error").iloc[0]
    safe = best["safe_staleness"]
    where = (
        "no staleness has enough tokens to judge"
        if pd.isna(safe)
        else "not even at staleness 0"
        if safe < 0
        else f"within tolerance up to staleness **{int(safe)}**"
    )
    st.markdown(
        f"Closest to the recomputed prox on this selection: **{best['method']}**, moving "
        f"**{best['gradient_mass_error']:.2%}** of the gradient mass and flipping "
        f"**{best['clip_flip_rate']:.2%}** of clip decisions; {where} (tolerance "
        f"{tolerance.max_gradient_mass_error:.1%} mass, {tolerance.max_clip_flip_rate:.1%} clip flips)."
    )


def render(ctx: Context) -> None:
    st.subheader("May I ship this estimator?")
    st.caption(
        "On a token that is neither clipped nor masked, prox cancels out of the gradient: an error in its "
        "estimate matters only where it flips PPO's clip or the behaviour-weight bound (docs/metrics.md)."
    )
    tolerance = _tolerance()
    frame = load(ctx.db, "decision", ctx.filters, tolerance)
    if frame.empty or frame["gradient_mass_error"].isna().all():
        st.info(
            f"Run {plain(ctx.run_id)} has no decision figures: they compare each estimate with the "
            "recomputed prox_logp, which this run did not record (or its advantages are all zero)."
        )
        return
    _headline(frame.dropna(subset=["gradient_mass_error"]), tolerance)
    _table(frame)
    by_staleness = load(ctx.db, "decision_by_staleness", ctx.filters)
    limits = {
        "gradient_mass_error": tolerance.max_gradient_mass_error,
        "clip_flip_rate": tolerance.max_clip_flip_rate,
    }
    for column, (figure, limit) in zip(st.columns(2), limits.items(), strict=True):
        with column:
            st.caption(f"{figure} by staleness: {COLUMNS[figure]}")
            chart = drift_charts.figure_by_staleness(
                by_staleness, figure, limit=limit, limit_name="tolerance", log_y=True
            )
            show(chart, figure)
