"""Live: the run's decision over the store's commits (each judged on the store as that commit left it,
DuckLake's time travel) and the alerts `proxaudit watch` raised about it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from dashboard import live_charts, live_queries
from dashboard.live_queries import Commit
from dashboard.views.common import Context, load, plain, show
from evaluator.errors import ProxauditError
from evaluator.gate import DEFAULT_THRESHOLDS

HISTORY_COMMITS = 20
"""The most recent commits of a run whose decision the page shows (each is judged once, then cached)."""


@st.cache_data(max_entries=4096, show_spinner=False)
def _judged(db: str, thresholds: str, stamp: int, run_id: str, snapshot: int, committed_at: float) -> dict:
    """A commit's row of the history: a snapshot never changes, so it is judged once per thresholds file
    (`stamp`: its mtime) and kept; its commit time tells a store made anew at the same place apart."""
    commit = Commit(snapshot, committed_at)
    return live_queries.history_row(commit, live_queries.decision_at(Path(db), thresholds, run_id, snapshot))


def history(ctx: Context, commits: list[Commit]) -> pd.DataFrame:
    path = ctx.thresholds or DEFAULT_THRESHOLDS
    stamp = path.stat().st_mtime_ns if path.is_file() else 0
    rows = [
        _judged(str(ctx.db), str(path), stamp, ctx.run_id, c.snapshot_id, c.committed_at) for c in commits
    ]
    return pd.DataFrame.from_records(rows, columns=list(live_queries.history_row(commits[0], None)))


def render(ctx: Context) -> None:
    st.subheader("Decision over commits")
    commits = load(ctx.db, "run_commits", ctx.run_id)
    shown = commits[-HISTORY_COMMITS:]
    if not shown:
        st.info(f"Run {plain(ctx.run_id)} has not been judged by any commit of this store yet.")
    else:
        st.caption(
            f"Run {plain(ctx.run_id)} was judged anew by {len(commits)} commits of the store (each file's "
            f"findings and intervals); the last {len(shown)} are shown (at most {HISTORY_COMMITS}), each "
            "decided on the store as that commit left it. Bars: the gated figure's 95% interval; dashed: "
            "its bound."
        )
        try:
            with st.spinner("judging the run at each commit"):
                frame = history(ctx, shown)
        except ProxauditError as error:
            st.error(plain(error))
        else:
            show(live_charts.decision_history(frame), "history")
            st.dataframe(frame.iloc[::-1], hide_index=True, key="history_table")

    st.subheader("Alerts")
    if ctx.alerts is None:
        st.info(
            "No alerts file given: start the dashboard with `--alerts FILE`, the file "
            "`proxaudit watch --alerts FILE` writes, to see the alerts about this run here."
        )
        return
    try:
        alerts = live_queries.alerts(ctx.alerts, ctx.run_id)
    except ProxauditError as error:
        st.error(plain(error))
        return
    if alerts.empty:
        st.caption(
            f"No alert about run {plain(ctx.run_id)} or the watched folders in {plain(ctx.alerts)} yet."
        )
        return
    st.caption(f"From {plain(ctx.alerts)}, newest first: the run's and the watched folders' (run_id empty).")
    st.dataframe(alerts, hide_index=True, key="alerts_table")
