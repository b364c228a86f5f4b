"""The quantile sketch's bucket code: accuracy, order, and agreement with the SQL macro of the store."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from evaluator.formulas.sketch import RELATIVE_ACCURACY, bucket_code, bucket_value, sketch_quantile
from schemas.store import STORE_DDL

finite = st.floats(min_value=-1e300, max_value=1e300, allow_nan=False)


def test_hand_worked_buckets():
    # 1.0 = 2^0 (1 + 0/64): bits >> 46 = 1023 * 64 = 65472, minus 62911 -> 2561; midpoint 1 + 0.5/64
    assert bucket_code([1.0])[0] == 2561
    assert bucket_value([2561])[0] == 1.0 + 0.5 / 64
    assert bucket_code([-1.0])[0] == -2561
    # 2^-40 is the first nonzero bucket; below it (and 0) is bucket 0
    np.testing.assert_array_equal(bucket_code([0.0, 1e-13, -1e-13, 2.0**-40]), [0, 0, 0, 1])
    assert bucket_value([0])[0] == 0.0


@given(finite)
def test_relative_error_at_most_1_over_128(x):
    value = bucket_value(bucket_code([x]))[0]
    if abs(x) < 2.0**-40:
        assert value == 0.0
    else:
        assert abs(value - x) <= RELATIVE_ACCURACY * abs(x)


@given(finite, finite)
def test_buckets_are_ordered_like_values(x, y):
    bx, by = bucket_code([x, y])
    if x < y:
        assert bx <= by


def test_sql_macro_agrees_with_python():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.lognormal(0, 8, 5000), -rng.lognormal(0, 8, 5000), [0.0, 2.0**-40, 1e300]])
    buckets = np.unique(bucket_code(x))
    con = duckdb.connect()
    con.execute(STORE_DDL)
    con.register("b", {"bucket": buckets.astype(np.int32)})
    got = np.array([r[0] for r in con.execute("SELECT proxaudit_bucket_value(bucket) FROM b").fetchall()])
    np.testing.assert_allclose(got, bucket_value(buckets), rtol=1e-15, atol=0)


@pytest.mark.parametrize(
    "name, values",
    [
        ("heavy-tailed pareto", np.random.default_rng(1).pareto(1.2, 50_000)),
        ("lognormal over 20 decades", np.random.default_rng(2).lognormal(-10, 5, 50_000)),
        ("near zero", np.random.default_rng(3).normal(0, 1e-9, 50_000) ** 2),
        ("negative log-probs", -np.random.default_rng(4).exponential(0.5, 50_000)),
    ],
)
def test_quantiles_within_2_percent_of_exact(name, values):
    buckets, counts = np.unique(bucket_code(values), return_counts=True)
    for q in (0.5, 0.9, 0.99):
        got = sketch_quantile(buckets, counts, q, values.min(), values.max())
        # the exact value at rank q (n - 1) lies between numpy's "lower" and "higher" quantiles
        lo, hi = np.quantile(values, q, method="lower"), np.quantile(values, q, method="higher")
        if max(abs(lo), abs(hi)) < 2.0**-40:
            assert got == 0.0 or abs(got) < 2.0**-40
            continue
        assert lo - 0.02 * abs(lo) <= got <= hi + 0.02 * abs(hi), (name, q, lo, got, hi)


def test_merging_sketches_is_adding_counts():
    rng = np.random.default_rng(5)
    a, b = rng.lognormal(0, 2, 10_000), rng.lognormal(3, 1, 7_000)
    both = np.concatenate([a, b])
    ua, ca = np.unique(bucket_code(a), return_counts=True)
    ub, cb = np.unique(bucket_code(b), return_counts=True)
    merged = np.concatenate([ua, ub]), np.concatenate([ca, cb])  # duplicate buckets are fine
    whole = np.unique(bucket_code(both), return_counts=True)
    for q in (0.5, 0.9, 0.99):
        lo, hi = both.min(), both.max()
        assert sketch_quantile(*merged, q, lo, hi) == sketch_quantile(*whole, q, lo, hi)
