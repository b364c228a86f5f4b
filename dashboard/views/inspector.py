"""Token inspector: one sequence from the raw token log, with every policy's log-prob per position, the
version segments (abort-resume) and proximal_t, to see what the summaries summarise."""

from __future__ import annotations

import streamlit as st

from dashboard import token_charts
from dashboard.views.common import Context, load, plain, seed, show


def render(ctx: Context) -> None:
    row = ctx.runs.set_index("run_id").loc[ctx.run_id]
    lo, hi = ctx.filters.steps or (int(row["first_step"]), int(row["last_step"]))
    # Default: mid-run, where every staleness occurs and resumed responses mix versions.
    seed("step", (lo + hi) // 2, lambda raw: int(raw) if lo <= int(raw) <= hi else None)
    step = int(st.number_input("step", min_value=lo, max_value=hi, key="step"))
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
    seed("seq", options[0], lambda raw: int(raw) if int(raw) in labels else None)
    seq_id = st.selectbox("seq_id (resumed sequences first)", options, format_func=labels.get, key="seq")
    tokens = load(ctx.db, "sequence_tokens", ctx.run_id, step, seq_id)
    st.caption("From " + ", ".join(plain(p) for p in reachable["path"]) + ".")
    show(token_charts.token_logps(tokens), "tokens")
    with st.expander("tokens"):
        st.dataframe(tokens, hide_index=True, width="stretch")
