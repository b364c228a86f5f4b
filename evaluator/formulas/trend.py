"""The trend of a figure over a run's steps: is it drifting toward the tolerance before it crosses it?

A figure per step is a ratio of that step's sums, `y_i = N_i / D_i` (gradient mass error: `N` = sum
|W(a) - W(g)|, `D` = sum W(g)); a method's excess at step `i` is its figure there minus the engine floor's
of the same step. The trend is the least-squares line through the points `(x_i, y_i)`, `x_i` the step:

    slope = sum_i (x_i - mean x)(y_i - mean y) / sum_i (x_i - mean x)^2,   intercept = mean y - slope mean x

Its 95% interval comes from the bootstrap over steps of `evaluator.formulas.bootstrap` (the same draws,
fixed seed): replicate `r` draws the points with replacement (`counts[r, i]` times point `i`) and refits
the line with those counts as weights (the pairs bootstrap), and the interval is the 2.5 and 97.5
percentiles of the replicate slopes. A drift is found when the slope's lower bound is above 0 and the line
reaches the tolerance within `horizon` steps of the last one:

    crossing = (tolerance - intercept) / slope   (the step at which the fit meets the tolerance)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from evaluator.formulas import F64, check_shapes
from evaluator.formulas.bootstrap import LEVEL, percentile_interval, step_draws

MIN_STEPS = 10
"""Fewer steps with a figure: no trend is fitted (a line through a handful of noisy points says nothing)."""


def step_figure(numerator: ArrayLike, denominator: ArrayLike) -> F64:
    """`[n_steps]` figure per step, `N_i / D_i`; NaN where the step has no denominator (no such tokens)."""
    num, den = np.asarray(numerator, dtype=np.float64), np.asarray(denominator, dtype=np.float64)
    check_shapes(numerator=num, denominator=den)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / den, np.nan)


def fit_lines(steps: F64, values: F64, counts: F64) -> tuple[F64, F64]:
    """(`[R]` intercepts, `[R]` slopes) of the least-squares lines through `[n]` points weighted by each
    row of `[R, n]` counts (a row of ones: the plain fit); NaN where a row's points share one step."""
    n = counts.sum(axis=1)  # (R,)
    sx, sy = counts @ steps, counts @ values  # (R,)
    sxx, sxy = counts @ (steps * steps), counts @ (steps * values)  # (R,)
    spread = n * sxx - sx * sx  # n^2 times the weighted variance of the steps
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(spread > 0, (n * sxy - sx * sy) / spread, np.nan)
    return (sy - slope * sx) / n, slope


@dataclass(frozen=True)
class Trend:
    """A figure's line over steps, with the slope's interval and where the line meets the tolerance."""

    n_steps: int
    first_step: int
    last_step: int
    intercept: float
    slope: float
    """the figure's change per step"""
    lower: float
    upper: float
    """the slope's 95% interval (a bootstrap over steps)"""
    tolerance: float
    crossing: float | None
    """the step at which the line meets the tolerance (None for a slope <= 0): past or ahead"""
    drifting: bool
    """the slope's lower bound is above 0 and the line meets the tolerance within the horizon"""

    @property
    def fitted_last(self) -> float:
        """The line's value at the last step."""
        return self.intercept + self.slope * self.last_step

    @property
    def crossed(self) -> bool:
        """The line is at or beyond the tolerance at the last step."""
        return self.fitted_last >= self.tolerance


def trend(
    steps: ArrayLike,
    values: ArrayLike,
    tolerance: float,
    *,
    horizon: float | None = None,
    level: float = LEVEL,
) -> Trend | None:
    """The trend of `[n_steps]` per-step `values` (NaN: a step without the figure, left out) over `steps`,
    or None with fewer than `MIN_STEPS` points. `horizon`: how many steps past the last one a crossing
    still counts as a drift (default: the span of the steps seen, "at this rate, within as long again")."""
    x, y = np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64)
    check_shapes(steps=x, values=y)
    kept = np.isfinite(y) & np.isfinite(x)
    x, y = x[kept], y[kept]
    if len(x) < MIN_STEPS or np.ptp(x) == 0:
        return None
    (intercept,), (slope,) = fit_lines(x, y, np.ones((1, len(x))))
    _, replicate_slopes = fit_lines(x, y, step_draws(len(x)))
    lower, upper = percentile_interval(replicate_slopes[:, None], level)
    first, last = int(x.min()), int(x.max())
    crossing = (tolerance - intercept) / slope if slope > 0 else None
    reach = last + (last - first if horizon is None else horizon)
    drifting = bool(lower[0] > 0 and crossing is not None and crossing <= reach)
    return Trend(
        n_steps=len(x), first_step=first, last_step=last, intercept=float(intercept), slope=float(slope),
        lower=float(lower[0]), upper=float(upper[0]), tolerance=tolerance,
        crossing=None if crossing is None else float(crossing), drifting=drifting,
    )  # fmt: skip
