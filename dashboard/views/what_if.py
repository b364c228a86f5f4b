"""The section "What if the trainer ran another loss?" on the Overview: the run's decision under each loss of
`replay --loss a,b,c` (the table `what_if`), the store's own loss first, so a user sees which loss
(correction) keeps the approximation within tolerance at the staleness they run."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import streamlit as st

from dashboard.views.common import Context, load
from evaluator.text_table import printable
from evaluator.verdict.summary import compact
from schemas.store import DEFAULT_TOLERANCE


def table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per loss as `summary --by what-if` shows it (`compact`: each figure with its 95% interval),
    then the figure its decision rests on."""
    shown = compact(pa.Table.from_pandas(frame, preserve_index=False), "what-if").to_pandas()
    return shown.drop(columns="run_id").assign(reason=frame["reason"].to_numpy())


def render(ctx: Context) -> None:
    """The sentence of each loss as plain text (nothing from the store is parsed), then the table."""
    frame = load(ctx.db, "what_if", ctx.run_id)
    st.subheader("What if the trainer ran another loss?")
    if frame.empty:
        st.caption(
            "No what-if on this run: `proxaudit replay LOGS --db DB --loss a,b,c` keeps the loss a in the "
            "store and judges the run under b and c beside it."
        )
        return
    tolerance = f"{DEFAULT_TOLERANCE.max_gradient_mass_error:.0%}"
    st.caption(
        "The decision on this run under each loss replay was given (the first is the store's, which the gate "
        "judges; the others replayed from the same files), by the same thresholds at the same staleness; "
        f"figures pooled over every staleness, with 95% intervals (the default tolerance: {tolerance})."
    )
    marks = {True: " (the store's loss)", False: ""}
    rows = frame.itertuples()
    lines = (f"- under {printable(r.loss)}{marks[r.own]}: {printable(r.sentence)}" for r in rows)
    st.text("\n".join(lines))
    st.dataframe(table(frame), width="stretch", hide_index=True)
