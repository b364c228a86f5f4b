"""Overview: the verdict banner (the gate, the method it gates, the engine floor, the safe staleness beyond
it, the loss), what each trainer would log on the run as its own mismatch figure, the run's data-driven
warnings if any (with their evidence, and the checks that could not decide), the decision (may I ship
this estimator?) and what it would be under other losses (the what-if table), then what is in the store
and the headline error of each method on the selected run."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, drift_charts
from dashboard.views import banner, decision, what_if
from dashboard.views.common import Context, load, plain, show

TRAINERS_INTRO = (
    "What your trainer would log on this run (its own mismatch figure, engine against trainer, at "
    "staleness 0), against the line it publishes; the Drift page has each definition and source:"
)
HEADLINE_METRICS = ("abs_error", "drift", "behave_imp_weight_abs_error", "importance_weight_abs_error")


def headline_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per method: abs_error statistics and the p99 of both weight errors (a statistic the
    selection has not, such as quantiles under a step range, is left out)."""
    stats = ["n", "mean", "p50", "p90", "p99", "max"]
    err = frame[frame["metric"] == "abs_error"].set_index("method")[stats].add_prefix("abs_error ")
    for metric in HEADLINE_METRICS[2:]:
        part = frame[frame["metric"] == metric].set_index("method")
        column = "p99" if part["p99"].notna().any() else "max"
        err[f"{metric} {column}"] = part[column]
    err = err.rename(columns={"abs_error n": "tokens"}).dropna(axis="columns", how="all")
    return err.loc[charts.ordered(err.index)]


def _numbers(ctx: Context) -> None:
    row = ctx.runs.set_index("run_id").loc[ctx.run_id]
    cols = st.columns(5)
    cols[0].metric("runs in the store", len(ctx.runs))
    cols[1].metric("tokens (loss_mask)", f"{int(row['n_tokens']):,}")
    cols[2].metric("steps", f"{int(row['n_steps']):,}", help=f"steps {row['first_step']}..{row['last_step']}")
    cols[3].metric("staleness", f"{row['min_staleness']}..{row['max_staleness']}")
    share = row["n_prox"] / row["n_tokens"] if row["n_tokens"] else 0.0
    cols[4].metric("with prox_logp", f"{share:.0%}", help="tokens with the recomputed ground truth")


def _findings(ctx: Context) -> None:
    """The run's data-driven warnings (stored by replay) with their evidence: what to check in the trainer
    before trusting any number below; and the checks the data could not decide."""
    rows = load(ctx.db, "findings", ctx.run_id)
    undecided = load(ctx.db, "undecided_checks", ctx.run_id)
    if not rows.empty:
        st.warning(
            f"{len(rows)} data-driven warning{'s' * (len(rows) != 1)} about {plain(ctx.run_id)}: the logs "
            "look "
            "wrong in a way a trainer bug leaves (docs/validate.md, 'Findings'). Check before trusting the "
            "numbers."
        )
        shown = rows.drop(columns="message").rename(columns={"advice": "what to check in the trainer"})
        st.dataframe(shown, hide_index=True, width="stretch")
        for row in rows.itertuples():
            with st.expander(f"{plain(row.rule)}: what was seen"):
                st.text(row.message)
    if not undecided.empty:
        with st.expander(f"{len(undecided)} checks of the findings could not decide on this run"):
            st.markdown("\n".join(f"- {plain(r.check_name)}: {plain(r.why)}" for r in undecided.itertuples()))


def _pairing(ctx: Context) -> None:
    """How much AReaL's shipped version pairing adds to the error on this run, and what to compare."""
    rows = load(ctx.db, "pairing", ctx.run_id).dropna(subset=["shipped_over_own"])
    if rows.empty:
        return
    parts = [
        f"`{r.interpolation}_shipped` {r.shipped_abs_error:.4g} vs `{r.interpolation}` {r.own_abs_error:.4g} "
        f"(**{r.shipped_over_own:.2f}x**)"
        for r in rows.itertuples()
    ]
    st.markdown(
        "AReaL's shipped version pairing (each token interpolated with the previous token's version), mean "
        f"abs_error: {'; '.join(parts)}. Compare AReaL's own logged `loglinear/*` metrics with "
        "`loglinear_shipped`, not `loglinear`."
    )


def _trainers(ctx: Context) -> None:
    """Under the decision: what the user's own trainer would log on this run, against its published line,
    as plain text (no Markdown: nothing from the store is parsed)."""
    sentences = load(ctx.db, "trainer_sentences", ctx.run_id)
    if sentences:
        st.text("\n".join([TRAINERS_INTRO, *(f"- {s}" for s in sentences)]))


def render(ctx: Context) -> None:
    banner.render(ctx, decision.tolerance())
    _trainers(ctx)
    _findings(ctx)
    decision.render(ctx)
    what_if.render(ctx)
    st.subheader("What is in the store")
    _numbers(ctx)
    frame = load(
        ctx.db, "run_headline", ctx.with_methods(*ctx.filters.methods, "ground_truth"), HEADLINE_METRICS
    )
    drift = frame[(frame["method"] == "ground_truth") & (frame["metric"] == "drift")]
    estimators = frame[frame["method"] != "ground_truth"]
    if not drift.empty:
        d = drift.iloc[0]
        q = f", p99 {d['p99']:.4g}" if pd.notna(d["p99"]) else f", max {d['max']:.4g}"
        st.markdown(f"True drift `abs(prox_logp - behave_logp)`: mean **{d['mean']:.4g}** nats{q}.")
    _pairing(ctx)
    st.subheader("Headline error per method")
    if ctx.filters.steps is not None or ctx.filters.staleness is not None:
        st.caption(
            "Step or staleness range selected: exact mean/min/max over it (quantiles need the full range)"
        )
    show(drift_charts.headline_bars(estimators[estimators["metric"] == "abs_error"], "abs_error"), "headline")
    if not estimators.empty:
        st.dataframe(headline_table(estimators), width="stretch")
    st.subheader("Tokens by staleness")
    show(drift_charts.tokens_by_staleness(load(ctx.db, "tokens_by_staleness", ctx.filters)), "tokens")
    st.subheader("Runs in the store")
    st.dataframe(ctx.runs, hide_index=True, width="stretch")
