"""Bucket code of the mergeable quantile sketch (DDSketch-style logarithmic buckets).

The mapping is DDSketch's (Masson, Rim and Lee, "DDSketch: a fast and fully-mergeable quantile sketch
with relative-error guarantees", VLDB 2019), in its cheapest form: the bucket of `x` is read straight off
the float64 bit pattern, with no log call,

    bucket(x) = sign(x) * ((bits(|x|) >> 46) - 62911)   # 11 exponent bits + the top 6 mantissa bits

so each bucket spans `[2^e (1 + k/64), 2^e (1 + (k+1)/64))`, and `|x| < 2^-40` falls in bucket 0 (the
offset 62911 = (bits(2^-40) >> 46) - 1 makes bucket 1 the first one above it and keeps codes small). A
bucket's representative value is its midpoint, so any value in it is within 1/128 (0.8%) relative of
it. Buckets are ordered like the values they hold, and a sketch is just counts per bucket: sketches of
different files, steps or staleness values merge by adding counts. A quantile at rank q * (n - 1) is the
representative value of the first bucket whose cumulative count exceeds that rank (the SQL views do it
with the macro `proxaudit_bucket_value` of `schemas/store.sql`, which must agree with `bucket_value`).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

MANTISSA_BITS = 6
SHIFT = 52 - MANTISSA_BITS
ZERO_BELOW = 2.0**-40
OFFSET = (np.array(ZERO_BELOW).view(np.int64) >> SHIFT) - 1  # 62911
RELATIVE_ACCURACY = 1.0 / 2 ** (MANTISSA_BITS + 1)


def bucket_code(x: ArrayLike) -> NDArray[np.int64]:
    """The bucket of each value of a float64 array: sign(x) * ((bits(|x|) >> 46) - 62911), 0 for
    |x| < 2^-40. Codes of values of one sign are contiguous small integers, ordered like the values.
    (Replay computes the same codes in a compiled loop, `evaluator.replay.kernels`.)"""
    bits = np.ascontiguousarray(x, dtype=np.float64).view(np.int64)
    code = ((bits & np.int64(0x7FFF_FFFF_FFFF_FFFF)) >> SHIFT) - OFFSET  # (T,) from |x|
    np.maximum(code, 0, out=code)  # everything below 2^-40 (and 0 itself) is bucket 0
    negative = bits >> 63  # (T,) -1 for negative x, else 0
    code ^= negative
    code -= negative  # two's complement negation where x < 0
    return code


def bucket_value(bucket: ArrayLike) -> NDArray[np.float64]:
    """The representative value (midpoint) of each bucket: sign * 2^(e - 1023) * (1 + (k + 0.5) / 64),
    where e and k are the exponent and mantissa bits of |bucket| + 62911."""
    bucket = np.asarray(bucket, dtype=np.int64)
    code = np.abs(bucket) + OFFSET
    exponent = (code >> MANTISSA_BITS) - 1023
    fraction = ((code & ((1 << MANTISSA_BITS) - 1)) + 0.5) / (1 << MANTISSA_BITS)
    with np.errstate(over="ignore"):  # the bucket of +-inf is +-inf
        value = np.sign(bucket) * np.ldexp(1.0 + fraction, exponent.astype(np.int32))
    return np.where(bucket == 0, 0.0, value)


def sketch_quantile(buckets: ArrayLike, counts: ArrayLike, q: float, lo: float, hi: float) -> float:
    """The q-quantile of a sketch (bucket -> count), clamped to the exact [lo, hi]: the representative of
    the first bucket (in value order) whose cumulative count exceeds the rank q * (n - 1)."""
    buckets, counts = np.asarray(buckets, np.int64), np.asarray(counts, np.int64)
    order = np.argsort(buckets)
    cumulative = np.cumsum(counts[order])
    rank = q * (cumulative[-1] - 1)
    chosen = buckets[order][np.searchsorted(cumulative, rank, side="right")]
    return float(np.clip(bucket_value(chosen), lo, hi))
