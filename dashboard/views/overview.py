"""Overview: the run's data-driven warnings if any (with their evidence, and the checks that could not
decide), the decision (may I ship this estimator?), then the
engine mismatch floor, what is in the store, the gate's verdict and the headline error of each method on
the selected run."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, drift_charts
from dashboard.views import decision
from dashboard.views.common import Context, load, plain, show
from evaluator.errors import ProxauditError

HEADLINE_METRICS = ("abs_error", "drift", "behave_imp_weight_abs_error", "importance_weight_abs_error")


def headline_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per method: abs_error statistics and the p99 of both weight errors."""
    stats = ["n", "mean", "p50", "p90", "p99", "max"]
    err = frame[frame["metric"] == "abs_error"].set_index("method")[stats].add_prefix("abs_error ")
    for metric in HEADLINE_METRICS[2:]:
        part = frame[frame["metric"] == metric].set_index("method")
        column = "p99" if part["p99"].notna().any() else "max"
        err[f"{metric} {column}"] = part[column]
    return err.rename(columns={"abs_error n": "tokens"}).loc[charts.ordered(err.index)]


def _numbers(ctx: Context) -> None:
    row = ctx.runs.set_index("run_id").loc[ctx.run_id]
    cols = st.columns(5)
    cols[0].metric("runs in the store", len(ctx.runs))
    cols[1].metric("tokens (loss_mask)", f"{int(row['n_tokens']):,}")
    cols[2].metric("steps", f"{int(row['n_steps']):,}", help=f"steps {row['first_step']}..{row['last_step']}")
    cols[3].metric("staleness", f"{row['min_staleness']}..{row['max_staleness']}")
    share = row["n_prox"] / row["n_tokens"] if row["n_tokens"] else 0.0
    cols[4].metric("with prox_logp", f"{share:.0%}", help="tokens with the recomputed ground truth")


def _gate(ctx: Context) -> None:
    if ctx.thresholds is None:
        st.caption("Gate: start the dashboard with `--thresholds FILE` to see the verdict here.")
        return
    try:
        verdicts = load(ctx.db, "gate_verdicts", str(ctx.thresholds), ctx.run_id, watch=ctx.thresholds)
    except ProxauditError as error:  # a missing or malformed thresholds file
        st.error(f"Gate: {plain(error)}")
        return
    counts = verdicts["verdict"].value_counts()
    text = ", ".join(f"{counts.get(v, 0)} {v}" for v in ("fail", "warn", "pass", "skip"))
    if counts.get("fail", 0):
        st.error(f"Gate FAILED on {plain(ctx.run_id)} ({plain(ctx.thresholds.name)}): {text}")
    else:
        st.success(f"Gate passed on {plain(ctx.run_id)} ({plain(ctx.thresholds.name)}): {text}")
    st.dataframe(verdicts, hide_index=True, width="stretch")


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
            with st.expander(f"{row.rule}: what was seen"):
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


def _mismatch(ctx: Context) -> None:
    """The engine mismatch floor in one line, against the published reference levels."""
    frame = load(ctx.db, "mismatch", ctx.run_id)
    floor = frame[frame["staleness"] == 0]
    if floor.empty or floor["n"].iloc[0] == 0:
        return
    f = floor.iloc[0]
    verl = (
        "normal" if f["prob_drift"] < 0.005 else "a precision problem" if f["prob_drift"] > 0.01 else "high"
    )
    nemo = "flagged" if f["exp_abs_drift"] > 1.05 else "fine"
    nxt = frame[frame["staleness"] > 0].head(1)
    share = (
        f"; it explains {nxt['floor_share'].iloc[0]:.1%} of the drift at staleness {nxt['staleness'].iloc[0]}"
        if len(nxt)
        else ""
    )
    st.markdown(
        f"Engine mismatch floor (drift at staleness 0, inference engine vs trainer at one version): mean "
        f"prob_drift **{f['prob_drift']:.4g}** (verl: {verl}), exp_abs_drift **{f['exp_abs_drift']:.4g}** "
        f"(NeMo-RL: {nemo} at 1.05){share}. The Drift page charts it."
    )


def render(ctx: Context) -> None:
    _findings(ctx)
    decision.render(ctx)
    _mismatch(ctx)
    st.subheader("What is in the store")
    _numbers(ctx)
    _gate(ctx)
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
