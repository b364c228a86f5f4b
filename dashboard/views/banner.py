"""The Overview's first screen: one verdict banner on the selected run. The gate's verdict (the thresholds the
dashboard was started with, else the default ones), the method those thresholds gate, the engine floor's
verdict against the tolerance and the reference lines of verl and NeMo-RL, the gated method's safe
staleness beyond the floor with its interval, and the loss the store was replayed under; the gate's checks
below it. The same verdict as `proxaudit summary --by decision` and `proxaudit gate` (evaluator.verdict)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard.queries import Filters, Tolerance
from dashboard.views.common import Context, load, plain
from evaluator.errors import ProxauditError
from evaluator.verdict import (
    NEMO_RL_FLAG,
    SHIPPED_NOTE,
    VERL_NORMAL,
    VERL_PROBLEM,
    Floor,
    method_sentence,
    verl_reading,
)
from schemas.store import METHODS
from schemas.thresholds import DEFAULT_THRESHOLDS

SHIPPED = "loglinear_shipped"
SEVERITY = {"fail": 0, "warn": 1, "pass": 2, "skip": 3}
LEVELS = ("safe_staleness", "safe_staleness_beyond_floor")


def _record(row: pd.Series) -> dict:
    """A view's row as plain values, None for null (what `evaluator.verdict` reads)."""
    return {k: None if not isinstance(v, str) and pd.isna(v) else v for k, v in row.items()}


def _between(lower: float | None, upper: float | None, fmt: str) -> str:
    return "" if lower is None or upper is None else f" (95%: {lower:{fmt}} to {upper:{fmt}})"


def gate_line(verdicts: pd.DataFrame, thresholds: str) -> tuple[str, str]:
    """(box, Markdown): the gate's verdict on the run in words, and the box it goes in (error, warning,
    success)."""
    counts = verdicts["verdict"].value_counts()
    judged = len(verdicts) - counts.get("skip", 0)
    fails, warns = counts.get("fail", 0), counts.get("warn", 0)
    status = "FAILED" if fails or not judged else "passed with warnings" if warns else "passed"
    text = (
        f"**Gate {status}** ({thresholds}): {fails} checks fail, {warns} warn, {counts.get('pass', 0)} pass"
    )
    text += f", {counts.get('skip', 0)} skipped." if counts.get("skip", 0) else "."
    for verdict, word, shown in (("fail", "Failing", None), ("warn", "Warning", 3)):  # every failing check
        names = [plain(n) for n in verdicts.loc[verdicts["verdict"] == verdict, "check"]]
        if names:
            more = f"; and {len(names) - shown} more" if shown and len(names) > shown else ""
            text += f" {word}: {'; '.join(names[:shown])}{more}."
    return ("error" if status == "FAILED" else "warning" if warns else "success"), text


def gated_methods(verdicts: pd.DataFrame) -> list[str]:
    """The methods the thresholds' checks judge, those of the blocking checks first (names of proxaudit's
    vocabulary: the thresholds file allows no other)."""
    ordered = verdicts.sort_values("warn_only", kind="stable")["method"].dropna()
    return [m for m in dict.fromkeys(ordered) if m in METHODS]


def method_line(methods: list[str]) -> str:
    if not methods:
        return "These thresholds gate no estimator, only figures of the whole run."
    names = ", ".join(f"`{m}`" for m in methods)
    note = (
        f" `{SHIPPED}` is {SHIPPED_NOTE} (AReaL interpolates each token with the previous token's version)."
        if SHIPPED in methods
        else f" (AReaL's `loglinear` computes `{SHIPPED}`: each token interpolated with the previous token's "
        "version.)"
    )
    return f"These thresholds gate {names}.{note}"


def floor_line(floor: pd.DataFrame, tolerance: Tolerance) -> str:
    """The engine floor's verdict with its intervals, against the tolerance and verl's and NeMo-RL's lines."""
    r = None if floor.empty else _record(floor.iloc[0])
    verdict = None if r is None else Floor(r, tolerance)
    if verdict is None or verdict.verdict == "unmeasured":
        return "**Engine floor: not measured**: no token at staleness 0 has prox_logp."
    gme, flips = r["gradient_mass_error"], r["clip_flip_rate"]
    prob, exp = r["prob_drift"], r["exp_abs_drift"]
    moves = (
        "At staleness 0, where every estimate is behave_logp, the inference engine alone moves "
        f"**{gme:.2%}** of the gradient mass"
        + _between(r["gradient_mass_error_lower"], r["gradient_mass_error_upper"], ".2%")
    )
    if flips is not None:
        moves += f" and flips **{flips:.2%}** of the clip decisions"
        moves += _between(r["clip_flip_rate_lower"], r["clip_flip_rate_upper"], ".2%")
    tol = f"tolerance {tolerance.max_gradient_mass_error:.2%} and {tolerance.max_clip_flip_rate:.2%}"
    lines = f"{moves} ({tol})."
    if prob is not None:
        lines += (
            f" Mean prob_drift **{prob:.4f}**"
            + _between(r["prob_drift_lower"], r["prob_drift_upper"], ".4f")
            + f": **{verl_reading(prob)}** by verl's lines (normal below {VERL_NORMAL}, a precision problem "
            f"above {VERL_PROBLEM})"
        )
    if exp is not None:
        flagged = "flagged" if exp > NEMO_RL_FLAG else "not flagged"
        lines += (
            f"; mean exp_abs_drift **{exp:.4f}**"
            + _between(r["exp_abs_drift_lower"], r["exp_abs_drift_upper"], ".4f")
            + f": **{flagged}** by NeMo-RL's line ({NEMO_RL_FLAG})."
        )
    advice = " Fix the engine's precision before blaming the approximation." if verdict.over else ""
    return f"**Engine floor: {verdict.word}.** {lines}{advice}"


def safe_lines(decision: pd.DataFrame, methods: list[str]) -> list[str]:
    """Each gated method's safe staleness beyond the floor and absolute, with 95% confidence."""
    lines = []
    for method in methods:
        rows = decision[decision["method"] == method]
        if rows.empty:
            lines.append(f"**{plain(method)}**: no decision figures on this run (it needs prox_logp).")
            continue
        row = _record(rows.iloc[0])
        for name in LEVELS:
            for key in (name, f"{name}_lower", f"{name}_upper"):
                row[key] = None if row[key] is None else int(row[key])
        lines.append(f"**Safe staleness** of {method_sentence(row).strip()}")
    return lines


def gate_table(verdicts: pd.DataFrame) -> pd.DataFrame:
    """The gate's checks as text, worst first: what each judges, the figure with its interval, the bound."""
    what = verdicts[["method", "figure", "metric", "stat"]].apply(
        lambda r: " ".join(str(v) for v in r if isinstance(v, str)), axis=1
    )
    measured = [
        "not measured"
        if pd.isna(o)
        else f"{o:.6g}" + ("" if pd.isna(lo) else f" (95%: {lo:.6g} to {hi:.6g})")
        for o, lo, hi in zip(verdicts["observed"], verdicts["lower"], verdicts["upper"], strict=True)
    ]
    table = pd.DataFrame(
        {"verdict": verdicts["verdict"], "outcome": verdicts["outcome"], "check": verdicts["check"],
         "judges": what, "measured": measured, "threshold": verdicts["threshold"],
         "tokens": verdicts["tokens"], "reason": verdicts["reason"]}
    )  # fmt: skip
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
    run = ctx.runs.set_index("run_id").loc[ctx.run_id]
    lines, box, verdicts = [f"**Verdict on run {plain(ctx.run_id)}**"], "info", None
    try:
        verdicts = load(ctx.db, "gate_verdicts", str(path), ctx.run_id, watch=path)
        box, text = gate_line(verdicts, which)
        lines.append(text)
    except ProxauditError as error:  # a missing or malformed thresholds file
        lines.append(f"**Gate: cannot judge** ({which}): {plain(error)}")
    if run["n_prox"] == 0:
        lines.append("No token of this run has prox_logp: nothing to judge the estimators against.")
    methods = gated_methods(verdicts) if verdicts is not None else [SHIPPED]
    lines.append(method_line(methods))
    lines.append(floor_line(load(ctx.db, "engine_floor", ctx.run_id), tolerance))
    lines += safe_lines(load(ctx.db, "decision", Filters((ctx.run_id,)), tolerance), methods)
    loss = load(ctx.db, "store_loss")
    described = f"{plain(loss.describe())} ({plain(loss.name)})"
    lines.append(f"Every figure here is computed under the loss the store was replayed under: {described}.")
    getattr(st, box)("\n\n".join(lines))
    if verdicts is not None and not verdicts.empty:
        with st.expander(f"The gate's {len(verdicts)} checks on this run"):
            st.dataframe(gate_table(verdicts), hide_index=True, width="stretch")
