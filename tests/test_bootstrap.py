"""The 95% intervals of a bootstrap over steps: they cover the true value of a ratio figure in about 95% of
seeded replicate runs (a flip rate and a gradient-mass-like ratio, steps of uneven size and their own
rates), the draws depend only on the number of steps, and the store's intervals are the gate's."""

from __future__ import annotations

import numpy as np
import pytest

from evaluator.formulas.bootstrap import percentile_interval, ratio_replicates, step_draws, steps_to_decide
from evaluator.store import connect_store
from evaluator.store.intervals import interval_tables

INTERVAL_TABLES = ("decision_interval", "mean_interval")

RUNS = 200
STEPS = 80


def flip_run(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Per-step (flips, tokens): 40-160 tokens a step, each step its own flip probability, Beta(2, 98)
    (the true rate, E[flips] / E[tokens], is 2 / 100 since the rate is independent of the size)."""
    tokens = rng.integers(40, 161, STEPS).astype(float)
    return rng.binomial(tokens.astype(int), rng.beta(2, 98, STEPS)).astype(float), tokens


def mass_run(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Per-step (moved mass, mass): lognormal token weights, a token's weight moved with probability
    0.03 by its full size (the true gradient mass error is 0.03)."""
    moved, mass = np.empty(STEPS), np.empty(STEPS)
    for i, n in enumerate(rng.integers(40, 161, STEPS)):
        w = rng.lognormal(0, 1, n)
        mass[i], moved[i] = w.sum(), (w * (rng.random(n) < 0.03)).sum()
    return moved, mass


@pytest.mark.parametrize("run, truth", [(flip_run, 0.02), (mass_run, 0.03)], ids=["flip_rate", "mass_error"])
def test_intervals_cover_the_true_value_about_95_percent_of_the_time(run, truth):
    rng = np.random.default_rng(7)
    draws = step_draws(STEPS)
    covered = 0
    for _ in range(RUNS):
        numerator, denominator = run(rng)
        lower, upper = percentile_interval(ratio_replicates(numerator[:, None], denominator[:, None], draws))
        covered += lower[0] <= truth <= upper[0]
    # 95% of 200: a binomial's 99.9% range is about 178-199; the percentile bootstrap of 80 steps runs a
    # little under its nominal level
    assert 0.89 <= covered / RUNS <= 0.99, covered


def test_draws_are_fixed_by_the_number_of_steps_and_resample_with_replacement():
    a, b = step_draws(30), step_draws(30)
    np.testing.assert_array_equal(a, b)
    assert a.shape == (1000, 30) and (a.sum(axis=1) == 30).all()
    assert (a == 0).any() and (a > 1).any()  # some steps left out, some drawn twice
    assert not np.array_equal(step_draws(31)[:, :30], a)


def test_the_draws_kept_stay_within_their_byte_budget_as_a_run_grows():
    """A long-lived process judging a growing run asks for new draws at every step count (and family-wise
    checks for draws several times as large): what is kept stays under `DRAWS_CACHE_BYTES`, the latest
    kept, draws larger than the budget recomputed each time (the same counts)."""
    from evaluator.formulas import bootstrap

    for n_steps in range(220, 600, 60):  # 14 to 31 MB each
        latest = step_draws(n_steps, 8 * 1000)
        assert bootstrap._DRAWS.currsize <= bootstrap.DRAWS_CACHE_BYTES
    assert step_draws(580, 8 * 1000) is latest and len(bootstrap._DRAWS) < 7
    huge = bootstrap.DRAWS_CACHE_BYTES // (8 * 1000) + 1  # steps whose draws alone pass the budget
    first, again = step_draws(huge), step_draws(huge)
    assert first is not again and np.array_equal(first, again)


def test_no_denominator_is_no_interval():
    lower, upper = percentile_interval(ratio_replicates(np.zeros((5, 1)), np.zeros((5, 1)), step_draws(5)))
    assert np.isnan(lower[0]) and np.isnan(upper[0])


def test_each_cell_s_interval_is_the_percentiles_of_its_finite_replicates():
    """Cells with every replicate, some NaN (a replicate that drew no step with a denominator), or none:
    each cell's bounds are numpy's percentiles of its own finite replicates (linear interpolation)."""
    rng = np.random.default_rng(3)
    replicates = rng.lognormal(-4, 1, (1000, 6))
    replicates[rng.random((1000, 6)) < np.array([0, 0.01, 0.3, 0.3, 0.999, 1])] = np.nan
    lower, upper = percentile_interval(replicates)
    for cell in range(5):
        finite = replicates[:, cell][~np.isnan(replicates[:, cell])]
        np.testing.assert_allclose([lower[cell], upper[cell]], np.percentile(finite, [2.5, 97.5]), rtol=1e-12)
    assert np.isnan(lower[5]) and np.isnan(upper[5])


def test_steps_to_decide_grows_as_the_value_nears_the_bound():
    # half-width 0.005 at 80 steps; 0.002 from the bound: 80 (0.005 / 0.002)^2 = 500 steps, 420 more
    assert steps_to_decide(0.012, 0.007, 0.017, 0.01, 80) == 420
    assert steps_to_decide(0.0101, 0.0051, 0.0151, 0.01, 80) > steps_to_decide(0.012, 0.007, 0.017, 0.01, 80)
    assert steps_to_decide(0.01, 0.005, 0.015, 0.01, 80) is None


def test_the_same_store_gives_the_same_intervals_to_the_last_bit(fixture_store):
    """The intervals are recomputed whenever a run's files change: DuckDB's threads must not change their
    last bits (sums over files and over stalenesses in a fixed order), and they are the stored ones."""
    tables = []
    for _ in range(4):
        with connect_store(fixture_store) as con:
            runs = [r for (r,) in con.execute("SELECT DISTINCT run_id FROM file_tokens").fetchall()]
            tables.append([t.sort_by([(c, "ascending") for c in t.column_names]).to_pylist()
                           for t in interval_tables(con, runs).values()])  # fmt: skip
    assert all(repr(t) == repr(tables[0]) for t in tables[1:])  # repr: NaN equals NaN, floats bit for bit
    with connect_store(fixture_store) as con:
        stored = [con.execute(f"SELECT * FROM {t} ORDER BY ALL").to_arrow_table() for t in INTERVAL_TABLES]
    assert repr([t.sort_by([(c, "ascending") for c in t.column_names]).to_pylist() for t in stored]) == repr(
        tables[0]
    )
