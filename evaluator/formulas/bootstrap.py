"""95% intervals of ratio figures by a bootstrap over steps: pure numpy.

A figure of a selection is a ratio of sums over its tokens, `F = sum_i N_i / sum_i D_i` with `N_i`, `D_i`
the sums of step `i` (gradient mass error: `N` = sum |W(a) - W(g)|, `D` = sum W(g); a flip rate or a
metric's mean: `N` = its sum, `D` = its count). The tokens of a step share its prompts, weights and
advantages, so the step is the unit resampled: each of `REPLICATES` replicates draws the run's steps with
replacement (`counts[r, i]` = how often step `i` is drawn) and recomputes `F_r = sum_i counts[r, i] N_i /
sum_i counts[r, i] D_i`; the interval is the 2.5 and 97.5 percentiles of the `F_r` (the percentile
bootstrap). The draws depend only on the run's number of steps and `SEED`, so the same store gives the same
interval, and every figure of a run uses the same draws (differences such as a method's excess over the
engine floor are paired).
"""

from __future__ import annotations

import threading

import numpy as np
from cachetools import LRUCache, cached
from numpy.typing import NDArray

from evaluator.formulas import F64
from schemas.figures import LEVEL

REPLICATES = 1000
SEED = 20261123


DRAWS_CACHE_BYTES = 64 << 20
"""The draws kept for the next caller (a gate judges several figures of one run on the same draws), the
latest first, up to this many bytes: a run's draws grow with its steps (and a family-wise check's with its
stalenesses: 1,000 x 8 x 1,000 steps is 64 MB), and a process that lives long (`watch`, the dashboard)
judges a growing run again at each new step count."""
_DRAWS: LRUCache = LRUCache(maxsize=DRAWS_CACHE_BYTES, getsizeof=lambda draws: draws.nbytes)


@cached(_DRAWS, lock=threading.Lock())
def step_draws(n_steps: int, replicates: int = REPLICATES, seed: int = SEED) -> NDArray[np.float64]:
    """`[replicates, n_steps]` multinomial counts: how often each step is drawn in each replicate (kept
    for the next caller, within `DRAWS_CACHE_BYTES`; read-only)."""
    rng = np.random.default_rng([seed, n_steps])
    draws = rng.multinomial(n_steps, np.full(n_steps, 1.0 / n_steps), size=replicates).astype(np.float64)
    draws.setflags(write=False)
    return draws


def ratio_replicates(numerator: F64, denominator: F64, draws: F64) -> F64:
    """`[replicates, cells]` bootstrap replicates of sum N / sum D for `[n_steps, cells]` sums (a cell with
    no denominator in a replicate is NaN)."""
    num, den = draws @ numerator, draws @ denominator  # (R, C)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den != 0, num / den, np.nan)


def percentile_interval(replicates: F64, level: float = LEVEL) -> tuple[F64, F64]:
    """(`[cells]` lower, upper): the central `level` interval of each cell's replicates (NaN replicates
    left out; NaN where every replicate is)."""
    tail = (1 - level) / 2 * 100
    finite = np.count_nonzero(~np.isnan(replicates), axis=0)
    out = np.full((2, replicates.shape[1]), np.nan)
    for k in np.unique(finite[finite > 0]):  # cells with as many finite replicates at once (NaN sorts last)
        cells = np.flatnonzero(finite == k)
        values = replicates[:, cells] if k == len(replicates) else np.sort(replicates[:, cells], axis=0)[:k]
        out[:, cells] = np.percentile(values, [tail, 100 - tail], axis=0)
    return out[0], out[1]


def steps_to_decide(value: float, lower: float, upper: float, threshold: float, n_steps: int) -> int | None:
    """About how many more steps an interval straddling `threshold` needs to exclude it: its half-width
    shrinks as 1/sqrt(steps), so `n (half-width / |value - threshold|)^2 - n`; None when the value is on
    the threshold (no number of steps decides it)."""
    gap, half = abs(value - threshold), (upper - lower) / 2
    if not gap > 0 or not np.isfinite(half):
        return None
    return max(1, int(np.ceil(round(n_steps * (half / gap) ** 2, 9))) - n_steps)
