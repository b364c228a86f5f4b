"""The trend test on a store's runs (`evaluator.formulas.trend`): the gradient mass error per step of the
engine floor (`rollout` at staleness 0) and of the method's excess over it (its figure at stalenesses 1..S
minus the floor's of the same step), each fitted over the steps with its 95% interval, against the
tolerance."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from evaluator.duck import literal
from evaluator.formulas.trend import Trend, step_figure, trend
from evaluator.store import open_store
from schemas.figures import shown

FLOOR = "engine floor"
"""The subject of the floor's trend (a method's is the method's name)."""
_STEP_SUMS_SQL = """
    SELECT run_id, step, grad_weight_abs_error AS moved, true_grad_weight AS mass
    FROM decision_over(lo := {lo}, hi := {hi}, by_step := true) WHERE method = {method}
    ORDER BY run_id, step"""


@dataclass(frozen=True)
class RunTrend:
    """The trend of one subject of one run: the engine floor, or a method's excess over it."""

    run_id: str
    subject: str
    trend: Trend

    def sentence(self) -> str:
        t = self.trend
        what = "the engine floor's gradient mass error" if self.subject == FLOOR else (
            f"{self.subject}'s gradient mass error beyond the engine floor"
        )  # fmt: skip
        rise = f"rises by {_percent(t.slope)} (95%: {_percent(t.lower)} to {_percent(t.upper)}) per step"
        if t.crossing is None:
            where = "and does not head for the tolerance"
        elif t.crossed:
            where = f"and its fit met the tolerance {_percent(t.tolerance)} at step {t.crossing:.0f}"
        else:
            where = f"and its fit meets the tolerance {_percent(t.tolerance)} at about step {t.crossing:.0f}"
        return f"{what} {rise} over steps {t.first_step}-{t.last_step}, {where}"


def run_trends(
    db: str | os.PathLike, method: str, tolerance: float, max_staleness: int | None = None
) -> list[RunTrend]:
    """The floor's and `method`'s excess trends of every run with enough steps (read-only), each against
    `tolerance`, a bound on the gradient mass error."""
    top = 2**31 - 1 if max_staleness is None else max_staleness
    with open_store(db) as con:
        floor = _step_sums(con, "rollout", 0, 0)
        approx = _step_sums(con, method, 1, top)
    limit = tolerance
    found = []
    for run in sorted(floor):
        f_steps, f_moved, f_mass = floor[run]
        floor_figure = step_figure(f_moved, f_mass)
        fitted = trend(f_steps, floor_figure, limit)
        if fitted is not None:
            found.append(RunTrend(run, FLOOR, fitted))
        if run not in approx:
            continue
        steps, moved, mass = approx[run]
        by_step = dict(zip(f_steps.tolist(), floor_figure.tolist(), strict=True))
        paired = np.array([by_step.get(s, np.nan) for s in steps.tolist()])  # (n_steps,) floor at each step
        fitted = trend(steps, step_figure(moved, mass) - paired, limit)
        if fitted is not None:
            found.append(RunTrend(run, method, fitted))
    return found


def _step_sums(con, method: str, lo: int, hi: int) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """`{run_id: (steps, moved, mass)}`: per step, the sums of |W(a) - W(g)| and of W(g) over the
    stalenesses `lo..hi` (NaN where a step has none)."""
    sql = _STEP_SUMS_SQL.format(method=literal(method), lo=literal(lo), hi=literal(hi))
    sums = con.execute(sql).fetchnumpy()
    runs = np.asarray(sums["run_id"], dtype=object)
    steps, moved, mass = (np.ma.filled(sums[c].astype(np.float64), np.nan) for c in ("step", "moved", "mass"))
    return {str(run): (steps[runs == run], moved[runs == run], mass[runs == run]) for run in np.unique(runs)}


def _percent(x: float) -> str:
    return shown(x, "percent")
