"""What every page shares: the page context, cached reads that survive a busy database, URL state."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import inspector_queries, live_queries, queries
from dashboard.queries import Filters
from evaluator.store import StoreBusy
from evaluator.text_table import markdown_code
from schemas.store import METHODS

ESTIMATORS = tuple(m for m in METHODS if m != "ground_truth")
ERROR_METRICS = (
    "abs_error",
    "rel_error",
    "squared_error",
    "behave_imp_weight_abs_error",
    "importance_weight_abs_error",
)
# Last good result of each read, served when replay holds the write lock for too long.
_LAST_GOOD: dict[tuple, tuple[Any, dt.datetime]] = {}
_LAST_GOOD_MAX = 512


@dataclass(frozen=True)
class Context:
    """The selection every page renders: the store, the sidebar filters and the store's runs."""

    db: Path
    thresholds: Path | None
    run_id: str
    filters: Filters
    runs: pd.DataFrame
    methods: tuple[str, ...]
    alerts: Path | None = None
    """the alerts file `proxaudit watch --alerts` writes (`--alerts`; None: not given)"""

    def with_methods(self, *methods: str) -> Filters:
        return replace(self.filters, methods=tuple(methods))


@st.cache_data(ttl=600, max_entries=512, show_spinner=False)
def _cached(name: str, db: str, version: tuple[int, ...], args: tuple) -> Any:
    module = next(m for m in (queries, inspector_queries, live_queries) if hasattr(m, name))
    return getattr(module, name)(Path(db), *args)


def load(db: Path, name: str, *args: Any, watch: Path | None = None) -> Any:
    """`queries.<name>(db, *args)` (or `inspector_queries.<name>`, `live_queries.<name>`), cached until the
    database changes. While a replay keeps the write lock past the retry budget, the last good result is
    shown with a note; a store error stops the page with its message (never a traceback). `watch`: another
    file whose changes invalidate the cache."""
    key = (name, str(db), args)
    if st.session_state.get("_busy_noted") and key in _LAST_GOOD:
        return _LAST_GOOD[key][0]  # busy already in this run: do not wait for the lock again
    version = queries.data_version(db)
    if watch is not None and watch.is_file():
        version += (watch.stat().st_mtime_ns,)
    try:
        value = _cached(name, str(db), version, args)
    except StoreBusy:
        if key not in _LAST_GOOD:
            st.warning(
                "database busy: replay in progress and nothing read yet; the page retries on your next action"
            )
            st.button("Retry")
            st.stop()
        value, at = _LAST_GOOD[key]
        if not st.session_state.get("_busy_noted"):
            st.session_state["_busy_noted"] = True
            st.info(f"database busy: replay in progress, showing data from {at:%H:%M:%S}")
        return value
    except queries.StoreError as error:
        st.error(plain(error))
        st.stop()
    if len(_LAST_GOOD) >= _LAST_GOOD_MAX:
        _LAST_GOOD.pop(next(iter(_LAST_GOOD)))
    _LAST_GOOD[key] = (value, dt.datetime.now())
    return value


def plain(value: object) -> str:
    """A value from the data as inert Markdown (`markdown_code`): shown as the characters it is, never
    as a link (Markdown's autolinks turn `www.x.org` or `a@b.org` into links even when escaped), an
    image, HTML, an icon or a formula. (Streamlit rewrites `:material/` to `:material_` before parsing,
    inside code too.)"""
    return markdown_code(str(value))


def seed(key: str, default: Any, parse: Callable[[str], Any] = str, valid: str = "") -> None:
    """Give widget `key` its starting value once per session: from the URL if valid, else `default` (a
    function: called only then, for a default that costs a read); the key's value goes into the URL at the
    end of this run (`publish`). A URL value that is not valid is noted (`rejected_links` says so on the
    page), with `valid` saying what is."""
    st.session_state.setdefault("_url_keys", []).append(key)
    if key in st.session_state:
        return
    raw = st.query_params.get(key)
    value = None
    if raw is not None:
        try:
            value = parse(raw)
        except (ValueError, TypeError):
            value = None
        if value is None:
            st.session_state.setdefault("_url_rejected", []).append((key, raw, valid))
    if value is None:
        value = default() if callable(default) else default
    st.session_state[key] = value


def rejected_links() -> None:
    """Say which values of the link (URL) this run could not show, and what it shows instead."""
    for key, raw, valid in st.session_state.pop("_url_rejected", []):
        why = f" ({valid})" if valid else ""
        shown = url_text(st.session_state.get(key))
        asked = f"The link asks for {key} = {plain(raw)}, which is not here{why}"
        st.warning(f"{asked}: showing {key} = {plain(shown)}.")


def subset(options: list | tuple) -> Callable[[str], list | None]:
    """A URL parser of "a,b" that keeps only known `options` (None when nothing is left)."""
    return lambda raw: [x for x in raw.split(",") if x in options] or None


def choice(options: list | tuple) -> Callable[[str], Any]:
    """A URL parser that accepts only one of `options` (compared as text)."""
    by_text = {str(option): option for option in options}
    return lambda raw: by_text.get(raw)


def int_range(lo: int, hi: int) -> Callable[[str], tuple[int, int] | None]:
    """A URL parser of "a-b" into a range clamped to [lo, hi]."""

    def parse(raw: str) -> tuple[int, int] | None:
        a, b = (int(x) for x in raw.split("-"))
        a, b = max(lo, min(a, b)), min(hi, max(a, b))
        return (a, b) if a <= b else None

    return parse


def url_text(value: Any) -> str:
    if isinstance(value, list | tuple):
        return (
            "-".join(map(str, value)) if all(isinstance(v, int) for v in value) else ",".join(map(str, value))
        )
    return str(value)


def publish() -> None:
    """Write the value of every widget seeded in this run into the URL, so that the view can be shared."""
    keys = dict.fromkeys(st.session_state.pop("_url_keys", []))
    st.query_params.from_dict({k: url_text(st.session_state[k]) for k in keys if k in st.session_state})


def show(fig: Any, key: str) -> None:
    st.plotly_chart(fig, key=f"chart_{key}", width="stretch", config={"displaylogo": False})


def note_missing_ground_truth(ctx: Context) -> None:
    """Say why error charts are empty on a run recorded without `prox_logp` (no recompute pass)."""
    if ctx.runs.set_index("run_id").loc[ctx.run_id, "n_prox"] == 0:
        st.info(
            f"Run {plain(ctx.run_id)} has no prox_logp (the ground truth; recorded without the recompute "
            "pass), so errors and the true drift cannot be measured. The Importance weights page still shows "
            "the estimators' weights."
        )
