"""The quantile sketch's bucket code: accuracy, order, and agreement with the SQL macro of the store."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from evaluator.formulas.sketch import bucket_code, bucket_value, sketch_quantile
from evaluator.store.maintenance import _BUCKET
from schemas.store import STORE_DDL
from tests.reference import QUANTILE_PERCENT, promised_value, within_promise

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
def test_relative_error_at_most_1_over_128_below_2_to_the_8_and_1_over_16_from_it(x):
    value = bucket_value(bucket_code([x]))[0]
    if abs(x) < 2.0**-40:
        assert value == 0.0
    elif abs(x) < 256:
        assert abs(value - x) <= abs(x) / 128  # docs/metrics.md's promise, not the code's own constant
    else:
        assert abs(value - x) <= abs(x) / 16


def test_hand_worked_coarse_buckets_from_2_to_the_8():
    # 256 = 2^8: fine bucket (1031 * 64) - 62911 = 3073, the first coarse one; it spans 2^8 (1 + [0, 8)/64)
    np.testing.assert_array_equal(
        bucket_code([255.99, 256.0, 256 * (1 + 7.99 / 64), 256 * (1 + 8 / 64), 512.0, -512.0]),
        [3072, 3073, 3073, 3074, 3081, -3081],
    )
    midpoints = [256 * (1 + 4 / 64), 256 * (1 + 12 / 64), 544]
    np.testing.assert_array_equal(bucket_value([3073, 3074, 3081]), midpoints)
    # bounded whatever the values: the largest float and infinity are buckets 3073 + 1015 * 8 + 7 and + 1
    biggest = np.finfo(np.float64).max
    np.testing.assert_array_equal(bucket_code([biggest, np.inf, -np.inf]), [11200, 11201, -11201])


@given(finite, finite)
def test_buckets_are_ordered_like_values(x, y):
    bx, by = bucket_code([x, y])
    if x < y:
        assert bx <= by


def test_sql_macro_agrees_with_python():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.lognormal(0, 8, 5000), -rng.lognormal(0, 8, 5000), [0.0, 2.0**-40, 256.0, 1e300]])
    buckets = np.unique(bucket_code(x))
    con = duckdb.connect()
    con.execute(STORE_DDL)
    con.register("b", {"bucket": buckets.astype(np.int32)})
    got = np.array([r[0] for r in con.execute("SELECT proxaudit_bucket_value(bucket) FROM b").fetchall()])
    np.testing.assert_allclose(got, bucket_value(buckets), rtol=1e-15, atol=0)


def test_converting_fine_buckets_gives_the_buckets_of_the_values():
    """`store convert`'s SQL remaps an old store's fine codes (64 per power of two throughout, computed here
    from the bits) to the codes `bucket_code` gives the same values."""
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.lognormal(0, 60, 20_000), -rng.lognormal(0, 60, 20_000), [0.0, 256.0, -256.0]])
    bits = x.view(np.int64)
    fine = np.maximum(((bits & 0x7FFF_FFFF_FFFF_FFFF) >> 46) - 62911, 0) * np.where(bits < 0, -1, 1)
    con = duckdb.connect()
    con.register("old", {"bucket": fine.astype(np.int32)})
    got = np.array([b for (b,) in con.execute(f"SELECT {_BUCKET} FROM old").fetchall()])
    np.testing.assert_array_equal(got, bucket_code(x))


@pytest.mark.parametrize(
    "name, values",
    [
        ("heavy-tailed pareto", np.random.default_rng(1).pareto(1.2, 50_000)),
        ("lognormal over 20 decades", np.random.default_rng(2).lognormal(-10, 5, 50_000)),
        ("near zero", np.random.default_rng(3).normal(0, 1e-9, 50_000) ** 2),
        ("negative log-probs", -np.random.default_rng(4).exponential(0.5, 50_000)),
        ("weights past 2^8 (coarse buckets)", np.random.default_rng(6).lognormal(5, 3, 50_000)),
    ],
)
def test_quantiles_within_the_promise_of_the_value_at_the_exact_rank(name, values):
    buckets, counts = np.unique(bucket_code(values), return_counts=True)
    for stat, percent in QUANTILE_PERCENT.items():
        got = sketch_quantile(buckets, counts, percent / 100, values.min(), values.max())
        promised = promised_value(values, stat)  # the sorted value at rank floor(q (n - 1))
        assert within_promise(got, promised), (name, stat, got, promised, abs(got / promised - 1))


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
