"""The trend test (evaluator.formulas.trend): the least-squares slope over steps is scipy's, its 95% interval
(a bootstrap over steps) covers a known slope in about 95% of seeded series, and a drift is found only when
the slope is surely positive and the line meets the tolerance within the horizon."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import linregress

from evaluator.formulas.trend import MIN_STEPS, fit_lines, step_figure, trend

RUNS = 200
STEPS = 60


class TestFitLines:
    def test_the_plain_fit_is_scipys_linregress(self):
        rng = np.random.default_rng(3)
        x = np.sort(rng.choice(500, 40, replace=False)).astype(float)
        y = 0.004 + 2e-5 * x + rng.normal(0, 0.002, 40)
        (intercept,), (slope,) = fit_lines(x, y, np.ones((1, 40)))
        reference = linregress(x, y)
        assert slope == pytest.approx(reference.slope, rel=1e-10)
        assert intercept == pytest.approx(reference.intercept, rel=1e-10)

    def test_counts_weigh_points_as_repeats(self):
        # a replicate that draws point 0 twice and leaves point 3 out is the plain fit of those points
        x, y = np.arange(4.0), np.array([0.0, 1.0, 1.0, 5.0])
        counts = np.array([[2.0, 1.0, 1.0, 0.0]])
        (intercept,), (slope,) = fit_lines(x, y, counts)
        reference = linregress([0.0, 0.0, 1.0, 2.0], [0.0, 0.0, 1.0, 1.0])
        assert slope == pytest.approx(reference.slope) and intercept == pytest.approx(reference.intercept)

    def test_one_distinct_step_has_no_line(self):
        _, slope = fit_lines(np.arange(3.0), np.ones(3), np.array([[0.0, 3.0, 0.0]]))
        assert np.isnan(slope[0])


def gaussian_series(rng: np.random.Generator, slope: float) -> tuple[np.ndarray, np.ndarray]:
    """A figure rising by `slope` per step from 0.003 with normal noise of sd 0.002, steps 0..59."""
    x = np.arange(STEPS, dtype=float)
    return x, 0.003 + slope * x + rng.normal(0, 0.002, STEPS)


def flip_series(rng: np.random.Generator, slope: float) -> tuple[np.ndarray, np.ndarray]:
    """A per-step flip rate, flips / tokens: 40-160 tokens a step, each flipped with probability
    0.01 + slope * step (the true slope of the rate)."""
    x = np.arange(STEPS, dtype=float)
    tokens = rng.integers(40, 161, STEPS)
    return x, step_figure(rng.binomial(tokens, 0.01 + slope * x), tokens)


@pytest.mark.parametrize("series", [gaussian_series, flip_series], ids=["gaussian", "flip_rate"])
def test_the_interval_covers_the_true_slope_about_95_percent_of_the_time(series):
    rng = np.random.default_rng(11)
    truth = 2e-4
    covered = 0
    for _ in range(RUNS):
        x, y = series(rng, truth)
        found = trend(x, y, tolerance=0.05)
        covered += found.lower <= truth <= found.upper
    # 95% of 200 (a binomial's 99.9% range is about 178-199); the percentile bootstrap of 60 steps runs a
    # little under its nominal level
    assert 0.89 <= covered / RUNS <= 0.99, covered


def test_a_flat_noisy_series_is_rarely_a_drift():
    rng = np.random.default_rng(5)
    found = [trend(*gaussian_series(rng, 0.0), tolerance=0.01).drifting for _ in range(RUNS)]
    # a one-sided 2.5% test, and the line must also reach 1% within 60 steps of noise around 0.3%
    assert sum(found) / RUNS <= 0.03


class TestDrift:
    def test_a_line_found_before_it_crosses(self):
        # y = 0.002 + 0.0002 x exactly: every replicate refits the same line; it meets 0.01 at step 40
        x = np.arange(20.0)
        found = trend(x, 0.002 + 0.0002 * x, tolerance=0.01)
        assert found.slope == pytest.approx(2e-4) and found.lower == pytest.approx(2e-4)
        assert found.crossing == pytest.approx(40.0)
        assert not found.crossed and found.fitted_last == pytest.approx(0.0058)
        # the default horizon is the span seen (19 steps): 19 + 19 = 38 < 40, not yet a drift
        assert not found.drifting
        assert trend(x, 0.002 + 0.0002 * x, tolerance=0.01, horizon=25).drifting  # 19 + 25 >= 40

    def test_a_line_already_past_the_tolerance(self):
        x = np.arange(30.0)
        found = trend(x, 0.002 + 0.0004 * x, tolerance=0.01)  # crosses at step 20
        assert found.drifting and found.crossed and found.crossing == pytest.approx(20.0)

    def test_a_falling_line_never_crosses(self):
        x = np.arange(30.0)
        found = trend(x, 0.02 - 0.0001 * x, tolerance=0.01)
        assert found.crossing is None and not found.drifting and found.upper < 0

    def test_steps_without_the_figure_are_left_out(self):
        x = np.arange(12.0)
        y = 0.001 * x
        y[[3, 7]] = np.nan
        found = trend(x, y, tolerance=1.0)
        assert found.n_steps == 10 and found.slope == pytest.approx(0.001)

    def test_too_few_steps_is_no_trend(self):
        x = np.arange(MIN_STEPS - 1, dtype=float)
        assert trend(x, x, tolerance=1.0) is None
        assert trend(np.full(MIN_STEPS, 4.0), np.arange(MIN_STEPS, dtype=float), tolerance=1.0) is None

    def test_shapes_must_match(self):
        with pytest.raises(ValueError, match="steps, values"):
            trend(np.arange(12.0), np.arange(11.0), tolerance=1.0)


def test_step_figure_is_nan_without_a_denominator():
    np.testing.assert_array_equal(step_figure([1.0, 2.0, 0.0], [4.0, 0.0, 0.0]), [0.25, np.nan, np.nan])
