"""The Overview's first screen: the decision on the selected run in one sentence a person acts on (what to
do, in the trainer's own config terms, and the figure with its interval it rests on), in a box that says how
it went; then the engine floor's own verdict, the gate's checks on the run, the staleness judged and where
it comes from, and the loss; the checks below, each requirement beside its verdict. The same `Decision` as
`proxaudit gate` and `proxaudit summary --by decision` (`evaluator.verdict`), under the thresholds the
dashboard was started with (else the default ones)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard.queries import Tolerance
from dashboard.views.common import Context, load, plain
from evaluator.errors import ProxauditError
from evaluator.gate import DEFAULT_THRESHOLDS, Verdict
from evaluator.verdict import Decision, sentence
from evaluator.verdict.records import observed_text, selection_text, threshold_text

BOX = {"ship": "success", "ship_up_to": "warning", "undecided": "warning", "do_not_ship": "error"}
SEVERITY = {"fail": 0, "warn": 1, "pass": 2, "skip": 3}


def gate_line(d: Decision, which: str) -> str:
    """The gate's checks on the run in words: how many fail, warn and pass, and which fail or warn (each
    named beside its verdict)."""
    counts = pd.Series([v.verdict for v in d.checks]).value_counts()
    judged = len(d.checks) - counts.get("skip", 0)
    fails, warns = counts.get("fail", 0), counts.get("warn", 0)
    status = "FAILED" if fails or not judged else "passed with warnings" if warns else "passed"
    passes = counts.get("pass", 0)
    text = f"**Gate {status}** on this run ({which}): {fails} checks fail, {warns} warn, {passes} pass"
    text += f", {counts.get('skip', 0)} skipped." if counts.get("skip", 0) else "."
    for verdict, word, shown in (("fail", "Failing", None), ("warn", "Warning or undecided", 3)):
        names = [plain(v.check.name) for v in d.checks if v.verdict == verdict]
        if names:
            more = f"; and {len(names) - shown} more" if shown and len(names) > shown else ""
            text += f" {word}: {'; '.join(names[:shown])}{more}."
    return text


def staleness_line(d: Decision) -> str:
    """Up to which staleness the approximation was judged, and where that comes from."""
    if d.limit.value is None:
        return (
            f"No staleness of this run has enough tokens with prox_logp to judge ({plain(d.limit.source)})."
        )
    return (
        f"Judged at each staleness 1 to **{d.limit.value}**, the staleness the trainer runs "
        f"({plain(d.limit.source)}; `proxaudit replay --loss-from` your trainer's config, or "
        "`--max-staleness`, sets it), family-wise at 95%."
    )


def checks_table(checks: tuple[Verdict, ...]) -> pd.DataFrame:
    """The gate's checks as text, worst first: each verdict beside its requirement, what was observed (with
    its interval), the threshold, the staleness judged and why."""
    columns = {
        "verdict": lambda v: v.verdict, "requirement": lambda v: v.check.name, "staleness": selection_text,
        "observed": lambda v: observed_text(v.observed), "threshold": threshold_text,
        "tokens": lambda v: v.tokens, "reason": lambda v: v.reason,
    }  # fmt: skip
    table = pd.DataFrame({name: [column(v) for v in checks] for name, column in columns.items()})
    return table.sort_values("verdict", key=lambda v: v.map(SEVERITY), kind="stable")


def render(ctx: Context, tolerance: Tolerance) -> None:
    """The banner, then the gate's checks in an expander."""
    path = ctx.thresholds or DEFAULT_THRESHOLDS
    which = (
        f"thresholds {plain(path.name)}"
        if ctx.thresholds
        else "the default thresholds, schemas/default_thresholds.toml; start the dashboard with "
        "`--thresholds FILE` to judge with yours"
    )
    try:
        judgement = load(ctx.db, "judgement", str(path), None, tolerance, watch=path)  # every run: cached
    except ProxauditError as error:  # a missing or malformed thresholds file
        floor = load(ctx.db, "floor_verdict", ctx.run_id, tolerance)
        st.warning(
            f"**Decision on run {plain(ctx.run_id)}: cannot judge** ({which}): {plain(error)}\n\n"
            + floor.sentence(plain(ctx.run_id))
        )
        return
    d = next(d for d in judgement.decisions if d.run_id == ctx.run_id)
    lines = [
        f"**Decision on run {plain(ctx.run_id)}**: {sentence(d, plain)}",
        d.floor.sentence(plain(ctx.run_id)),
        gate_line(d, which),
        staleness_line(d),
        f"Every figure here is computed under the loss the store was replayed under: "
        f"{plain(judgement.loss.describe())} ({plain(judgement.loss.name)}).",
    ]
    getattr(st, BOX[d.action])("\n\n".join(lines))
    if d.checks:
        with st.expander(
            f"The gate's {len(d.checks)} checks on this run, each requirement beside its verdict"
        ):
            st.dataframe(checks_table(d.checks), hide_index=True, width="stretch")
