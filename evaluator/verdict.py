"""The verdict in words, from the store's public views: for each run, the engine floor (what the inference
engine alone moves at staleness 0) against the tolerance and the reference lines of verl and NeMo-RL, and
each method's safe staleness beyond the floor with its 95% interval. `summary`, the gate and the
dashboard's first screen say these same sentences."""

from __future__ import annotations

import math
from dataclasses import dataclass

import duckdb

from evaluator.formulas.loss import DEFAULT_LOSS
from evaluator.store.reader import stored_loss
from schemas.store import DEFAULT_TOLERANCE, Tolerance

VERL_NORMAL, VERL_PROBLEM = 0.005, 0.01
"""verl's FAQ: a mean |p_rollout - p_train| below 0.005 is normal, above 0.01 a precision problem."""
NEMO_RL_FLAG = 1.05
"""NeMo-RL flags a mean exp(|logp_gen - logp_train|) above 1.05."""
SHIPPED_NOTE = "what AReaL's prox_logp_method loglinear computes"


def judged(value: float | None, lower: float | None, upper: float | None, limit: float) -> str:
    """`pass` (the interval's upper bound within the limit), `fail` (its lower bound beyond it),
    `inconclusive` (it straddles the limit), or `unmeasured`."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "unmeasured"
    high = value if upper is None else upper
    low = value if lower is None else lower
    return "pass" if high <= limit else "fail" if low > limit else "inconclusive"


def percent(value: float | None, lower: float | None = None, upper: float | None = None) -> str:
    if value is None:
        return "n/a"
    interval = "" if lower is None or upper is None else f" (95%: {100 * lower:.2f}-{100 * upper:.2f}%)"
    return f"{100 * value:.2f}%{interval}"


@dataclass(frozen=True)
class Floor:
    """A run's engine floor (the view `engine_floor`) and its verdict against the tolerance."""

    row: dict
    tolerance: Tolerance

    @property
    def verdict(self) -> str:
        r = self.row
        gme = judged(*_figure(r, "gradient_mass_error"), self.tolerance.max_gradient_mass_error)
        flips = judged(*_figure(r, "clip_flip_rate"), self.tolerance.max_clip_flip_rate)
        verdicts = {gme, flips} - {"unmeasured"}
        return next((v for v in ("fail", "inconclusive", "pass") if v in verdicts), "unmeasured")

    @property
    def over(self) -> bool:
        """Whether the point estimate of a figure is beyond the tolerance."""
        r = self.row
        return r["gradient_mass_error"] > self.tolerance.max_gradient_mass_error or (
            (r["clip_flip_rate"] or 0) > self.tolerance.max_clip_flip_rate
        )

    @property
    def word(self) -> str:
        """The verdict as a verb phrase: passes or fails the tolerance, at 95% or, when the interval
        straddles it, by the point estimate."""
        if self.verdict == "inconclusive":
            verb = "fails" if self.over else "passes"
            return f"{verb} the tolerance by its point estimate, inconclusive at 95%"
        return {"fail": "fails", "pass": "passes"}[self.verdict] + " the tolerance"

    def sentence(self) -> str:
        r = self.row
        if self.verdict == "unmeasured":
            return f"{r['run_id']}: no token at staleness 0 with prox_logp: the engine floor is not measured."
        drift = r["prob_drift"]
        flagged = r["exp_abs_drift"] is not None and r["exp_abs_drift"] > NEMO_RL_FLAG
        word, over = self.word, self.over
        advice = " Fix the engine's precision before blaming the approximation." if over else ""
        return (
            f"{r['run_id']}: the engine floor {word}: at staleness 0, where every estimate is "
            f"behave_logp, the inference engine alone moves {percent(*_figure(r, 'gradient_mass_error'))} of "
            f"the gradient mass and flips {percent(r['clip_flip_rate'])} of the clip decisions (tolerance "
            f"{percent(self.tolerance.max_gradient_mass_error)}); mean prob_drift "
            f"{'n/a' if drift is None else f'{drift:.4f}'} (verl: {verl_reading(drift)})"
            f"{', flagged by NeMo-RL' if flagged else ''}.{advice}"
        )


def verl_reading(prob_drift: float | None) -> str:
    """verl's reading of a mean prob_drift: normal, above normal, or a precision problem."""
    if prob_drift is None:
        return "unmeasured"
    return (
        "normal" if prob_drift < VERL_NORMAL
        else "a precision problem" if prob_drift > VERL_PROBLEM
        else "above normal"
    )  # fmt: skip


def _figure(row: dict, name: str) -> tuple:
    """(value, lower, upper) of a figure of a view's row."""
    return row[name], row[f"{name}_lower"], row[f"{name}_upper"]


def method_sentence(row: dict) -> str:
    """`method`: its safe staleness beyond the floor and absolute, each with the 95% bounds."""

    def level(name: str) -> str:
        point, low, high = row[name], row[f"{name}_lower"], row[f"{name}_upper"]
        if point is None:
            return "not measured (too few tokens)"
        return f"{low} with 95% confidence (point estimate {point}, at most {high})"

    note = f" ({SHIPPED_NOTE})" if row["method"] == "loglinear_shipped" else ""
    beyond, absolute = level("safe_staleness_beyond_floor"), level("safe_staleness")
    return (
        f"  {row['method']}{note}: safe beyond the engine floor up to staleness {beyond}; "
        f"absolute: {absolute}."
    )


def loss_line(con: duckdb.DuckDBPyConnection) -> str:
    """The loss the store's decision figures were computed under, in one line."""
    loss = stored_loss(con)
    loss = DEFAULT_LOSS if loss is None else loss
    return f"Under the loss {loss.describe()} ({loss.name}):"


def verdict_lines(
    con: duckdb.DuckDBPyConnection, tolerance: Tolerance = DEFAULT_TOLERANCE, methods: tuple[str, ...] = (),
    run: str | None = None,
) -> list[str]:  # fmt: skip
    """Per run: the floor's sentence, then one line per method (all estimators, or `methods`)."""
    floors = con.sql("SELECT * FROM engine_floor ORDER BY run_id").to_arrow_table().to_pylist()
    sql = f"SELECT * FROM {Tolerance.SQL} ORDER BY run_id, method"
    rows = con.sql(sql, params=tolerance.values()).to_arrow_table().to_pylist()
    lines = []
    for floor in floors:
        if run is not None and floor["run_id"] != run:
            continue
        lines.append(Floor(floor, tolerance).sentence())
        lines += [
            method_sentence(row)
            for row in rows
            if row["run_id"] == floor["run_id"] and (not methods or row["method"] in methods)
        ]
    return lines
