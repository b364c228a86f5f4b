"""The proxaudit dashboard (Streamlit): is the proximal log-prob approximation safe for this run?

Run it with `proxaudit dashboard --db DB` (or `streamlit run dashboard/app.py -- --db DB`). The app opens
the metrics store read-only and never writes. The page, the sidebar filters and each page's own choices
live in the URL (`?page=drift&run=...`), so a view can be shared; the thresholds file comes from the
command line only (a URL never makes the app open a file). Every value from the store is shown as plain
text.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
from pathlib import Path

import streamlit as st

from dashboard import queries
from dashboard.defaults import default_methods
from dashboard.views import PAGES, common
from evaluator.errors import ProxauditError
from evaluator.gate import DEFAULT_THRESHOLDS
from evaluator.text_table import printable
from schemas.store import DEFAULT_TOLERANCE

REPLAY_HINT = """No runs in this database yet. Fill it from token logs (Parquet, schema v1) with

    proxaudit replay LOGS --db {db}

and this page shows them as soon as the first file is committed (replay may run while the dashboard
is open)."""


METHODS_HELP = (
    "Drawn on every chart. Default: the method the gate's thresholds judge and AReaL's own options "
    "(loglinear_shipped and linear_shipped: loglinear and linear as AReaL computes them; rollout); add any "
    "other here."
)


def _arguments() -> tuple[Path | None, Path | None, Path | None]:
    """`--db`, `--thresholds` and `--alerts` after `--` on the streamlit command line, else PROXAUDIT_DB,
    PROXAUDIT_THRESHOLDS and PROXAUDIT_ALERTS from the environment (how tests point the app at a database)."""
    parser = argparse.ArgumentParser(add_help=False)
    for option in ("--db", "--thresholds", "--alerts"):
        parser.add_argument(option, type=Path)
    args, _ = parser.parse_known_args(sys.argv[1:])
    given = (args.db, args.thresholds, args.alerts)
    names = ("PROXAUDIT_DB", "PROXAUDIT_THRESHOLDS", "PROXAUDIT_ALERTS")
    db, thresholds, alerts = (
        value or (Path(os.environ[name]) if os.environ.get(name) else None)
        for value, name in zip(given, names, strict=True)
    )
    return db, thresholds, alerts


def _range_filter(label: str, key: str, lo: int, hi: int) -> tuple[int, int] | None:
    """A range slider over [lo, hi]; None (no restriction) when it covers everything."""
    if lo >= hi:
        st.sidebar.caption(f"{label}: {lo} (the only value)")
        return None
    common.seed(key, (lo, hi), common.int_range(lo, hi))
    chosen = st.sidebar.slider(label, min_value=lo, max_value=hi, key=key)
    return None if tuple(chosen) == (lo, hi) else (int(chosen[0]), int(chosen[1]))


def _worst_run(db: Path, thresholds: Path | None, run_ids: list[str]) -> str:
    """The run the Overview opens on: the worst decision (do not ship, cannot tell, ship up to, ship; then
    the largest figure) under the thresholds; the first run when they cannot judge. A store of one run is
    not judged for it."""
    if len(run_ids) == 1:
        return run_ids[0]
    path = thresholds or DEFAULT_THRESHOLDS
    try:
        judgement = common.load(db, "judgement", str(path), None, DEFAULT_TOLERANCE, watch=path)
    except ProxauditError:  # a bad thresholds file: the banner says so
        return run_ids[0]
    ranked = sorted(judgement.decisions, key=lambda d: d.rank)
    return ranked[0].run_id if ranked else run_ids[0]


def _sidebar(db: Path, thresholds: Path | None, alerts: Path | None, runs) -> common.Context:
    """The filters: page, run, methods, staleness range, step range, thresholds file."""
    common.seed("page", "overview", common.choice(list(PAGES)))
    st.sidebar.radio("Page", list(PAGES), format_func=lambda slug: PAGES[slug][0], key="page")
    run_ids = list(runs["run_id"])
    common.seed("run", lambda: _worst_run(db, thresholds, run_ids), common.choice(run_ids))
    run_id = st.sidebar.selectbox("run_id", run_ids, key="run", format_func=printable)  # controls spelled out
    present = common.load(db, "methods_present", (run_id,))
    estimators = [m for m in present if m != "ground_truth"]
    common.seed("methods", default_methods(estimators, thresholds), common.subset(estimators))
    methods = st.sidebar.multiselect("method (estimators)", estimators, key="methods", help=METHODS_HELP)
    if not methods:
        st.sidebar.caption("No method chosen: showing every estimator.")
    methods = methods or estimators
    row = runs.set_index("run_id").loc[run_id]
    staleness = _range_filter("staleness", "staleness", int(row["min_staleness"]), int(row["max_staleness"]))
    steps = _range_filter("step", "steps", int(row["first_step"]), int(row["last_step"]))
    gate = common.plain(thresholds.name) if thresholds else "the default ones (`--thresholds FILE` for yours)"
    st.sidebar.caption(f"database: {common.plain(str(db))} (read-only); gate thresholds: {gate}")
    filters = queries.Filters((run_id,), tuple(methods), staleness, steps)
    return common.Context(db, thresholds, run_id, filters, runs, tuple(present), alerts)


def _stamp(db: Path, alerts: Path | None) -> tuple[int, ...]:
    """Changes whenever a writer commits to the store, or the alerts file grows."""
    grown = (alerts.stat().st_size,) if alerts is not None and alerts.is_file() else (0,)
    return queries.data_version(db) + grown


@st.fragment(run_every=dt.timedelta(seconds=1))
def _follow_commits(db: Path, alerts: Path | None) -> None:
    """Rerun the whole app when a writer has committed (or an alert was written) since the page's reads;
    else say which commit the page shows and how long ago it was made, kept current."""
    if _stamp(db, alerts) != st.session_state["_stamp"]:
        st.rerun()
    if st.session_state["_stamp"][:-1]:  # a store
        commit = common.load(db, "latest_commit")
        ago = max(0.0, time.time() - commit.committed_at)
        st.caption(f"as of commit {commit.snapshot_id}, {ago:.0f} s ago")


def _follow(db: Path, alerts: Path | None) -> None:
    with st.sidebar:
        _follow_commits(db, alerts)


def main() -> None:
    st.set_page_config(page_title="proxaudit", layout="wide")
    st.session_state["_url_keys"] = []
    st.session_state["_busy_noted"] = False
    st.session_state["_url_rejected"] = []
    db, thresholds, alerts = _arguments()
    if db is None:
        st.error("No database given: start the dashboard with `proxaudit dashboard --db DB`.")
        st.stop()
    st.session_state["_stamp"] = _stamp(db, alerts)  # before the page's reads: a commit during them reruns it
    runs = common.load(db, "store_overview")
    if runs.empty:
        st.title("proxaudit")
        st.info(REPLAY_HINT.format(db=db))
        _follow(db, alerts)
        st.stop()
    ctx = _sidebar(db, thresholds, alerts, runs)
    title, render = PAGES[st.session_state["page"]]
    st.title(title)
    links = st.container()
    render(ctx)
    with links:
        common.rejected_links()
    common.publish()
    _follow(db, alerts)


main()
