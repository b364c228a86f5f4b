"""Token inspector: one sequence from the raw token log, with every policy's log-prob per position, the
chosen estimates and their error against prox_logp, the version segments (abort-resume) and proximal_t,
to see what the summaries summarise."""

from __future__ import annotations

import streamlit as st

from dashboard import token_charts, token_estimates
from dashboard.views.common import Context, load, plain, seed, show, subset

SHIPPED = "loglinear_shipped"  # what AReaL's prox_logp_method loglinear computes


def _step(ctx: Context) -> int:
    """The step picker. Default: the step with prox_logp nearest the middle of the range (mid-run every
    staleness occurs and resumed responses mix versions); the middle when no step has prox_logp."""
    row = ctx.runs.set_index("run_id").loc[ctx.run_id]
    lo, hi = ctx.filters.steps or (int(row["first_step"]), int(row["last_step"]))
    with_prox = [s for s in load(ctx.db, "steps_with_prox", ctx.run_id) if lo <= s <= hi]
    middle = (lo + hi) // 2
    default = min(with_prox, key=lambda s: (abs(s - middle), s)) if with_prox else middle
    valid = f"run {plain(ctx.run_id)} has steps {lo}..{hi} in the selected range"
    seed("step", default, lambda raw: int(raw) if lo <= int(raw) <= hi else None, valid=valid)
    step = int(st.number_input("step", min_value=lo, max_value=hi, key="step"))
    if with_prox and step not in with_prox:
        nearest = min(with_prox, key=lambda s: (abs(s - step), s))
        st.info(
            f"Step {step} has no prox_logp (no recompute at this step), so no estimate's error can be drawn: "
            f"{len(with_prox)} steps in the range have it, the nearest is {nearest}."
        )
    return step


def _estimates(ctx: Context) -> list[str]:
    """The estimators whose estimates are drawn (default: what AReaL's `loglinear` computes)."""
    options = [m for m in ctx.methods if m != "ground_truth"]
    default = [SHIPPED] if SHIPPED in options else options[:1]
    seed("estimates", default, subset(options))
    return st.multiselect("estimates drawn", options, key="estimates", help=f"{SHIPPED}: what AReaL computes")


def render(ctx: Context) -> None:
    step = _step(ctx)
    files = load(ctx.db, "log_files", ctx.run_id, step)
    if files.empty:
        st.info(f"Run {plain(ctx.run_id)} has no tokens at step {step}.")
        return
    reachable = files[files["reachable"]]
    if reachable.empty:
        paths = ", ".join(plain(p) for p in files["path"])
        st.warning(
            f"The raw token log of step {step} is not reachable here (moved, changed since the replay, or on "
            f"another machine): {paths}"
        )
        return
    seqs = load(ctx.db, "sequences", ctx.run_id, step)
    if seqs.empty:
        st.info(f"The raw log holds no tokens of run {plain(ctx.run_id)} at step {step}.")
        return
    options = [int(s) for s in seqs["seq_id"]]
    labels = {
        int(r.seq_id): f"{r.seq_id}: {r.n_tokens} tokens, {r.n_segments} segment(s), staleness "
        f"{r.min_staleness}..{r.max_staleness}"
        for r in seqs.itertuples()
    }
    seed(
        "seq",
        options[0],
        lambda raw: int(raw) if int(raw) in labels else None,
        valid=f"step {step}'s seq_ids",
    )
    seq_id = st.selectbox("seq_id (resumed sequences first)", options, format_func=labels.get, key="seq")
    methods = _estimates(ctx)
    tokens = load(ctx.db, "sequence_tokens", ctx.run_id, step, seq_id)
    estimates = token_estimates.per_token(tokens, step)
    st.caption("From " + ", ".join(plain(p) for p in reachable["path"]) + ".")
    fig, segments = token_charts.token_logps(tokens, estimates, methods)
    show(fig, "tokens")
    st.caption("Version segments (shaded, labelled v<version>): " + "; ".join(segments) + ".")
    with st.expander("tokens"):
        st.dataframe(tokens, hide_index=True, width="stretch")
