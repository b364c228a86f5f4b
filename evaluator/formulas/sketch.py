"""Bucket code of the mergeable quantile sketch (DDSketch-style logarithmic buckets, bounded).

The mapping is DDSketch's (Masson, Rim and Lee, "DDSketch: a fast and fully-mergeable quantile sketch
with relative-error guarantees", VLDB 2019), in its cheapest form: the fine bucket of `x` is read straight
off the float64 bit pattern, with no log call,

    fine(x) = (bits(|x|) >> 46) - 62911   # 11 exponent bits + the top 6 mantissa bits

so each fine bucket spans `[2^e (1 + k/64), 2^e (1 + (k+1)/64))`, and `|x| < 2^-40` falls in bucket 0 (the
offset 62911 = (bits(2^-40) >> 46) - 1 makes bucket 1 the first one above it and keeps codes small). From
`|x| >= 2^8` on (fine bucket 3073), eight fine buckets make one (8 buckets per power of two):

    bucket(x) = sign(x) * (fine(x)                          if fine(x) < 3073
                           3073 + ((fine(x) - 3073) >> 3)   otherwise)

so a sketch holds at most 3073 + 1016 * 8 buckets of each sign, whatever the values (a run whose weights
spread over 200 powers of two keeps 4,700, not 16,400), and its rows do not grow with a drift that
spreads the tails. A bucket's representative value is its midpoint: within 1/128 (0.8%) relative of any
value in it below 2^8, within 1/16 (6.25%) from 2^8 on (an importance weight of 300 or a log-prob error
of 300 nats is known to 6%; every threshold a gate judges lies far below). Buckets are ordered like the
values they hold, and a sketch is just counts per bucket: sketches of different files, steps or staleness
values merge by adding counts. A quantile at rank q * (n - 1) is the representative value of the first
bucket whose cumulative count exceeds that rank (the SQL views do it with the macro
`proxaudit_bucket_value` of `schemas/views.sql`, which must agree with `bucket_value`).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

MANTISSA_BITS = 6
SHIFT = 52 - MANTISSA_BITS
ZERO_BELOW = 2.0**-40
OFFSET = (np.array(ZERO_BELOW).view(np.int64) >> SHIFT) - 1  # 62911
COARSE_FROM = 2.0**8
"""From this magnitude on, buckets are 8 times wider (8 per power of two)."""
COARSE_BITS = 3
COARSE = int(np.array(COARSE_FROM).view(np.int64) >> SHIFT) - int(OFFSET)  # 3073: the first coarse bucket


def coarsened(fine: NDArray[np.int64]) -> NDArray[np.int64]:
    """Bucket codes from fine codes of the same sign (>= 0): 3073 + ((fine - 3073) >> 3) from 3073 on
    (`proxaudit store convert` does the same in SQL to an old store's fine buckets: each bucket is a union
    of fine ones, so the conversion is exact)."""
    return np.where(fine < COARSE, fine, COARSE + ((fine - COARSE) >> COARSE_BITS))


def bucket_code(x: ArrayLike) -> NDArray[np.int64]:
    """The bucket of each value of a float64 array: sign(x) * coarsened((bits(|x|) >> 46) - 62911), 0 for
    |x| < 2^-40. Codes of values of one sign are contiguous small integers, ordered like the values.
    (Replay computes the same codes in a compiled loop, `evaluator.replay.kernels`.)"""
    bits = np.ascontiguousarray(x, dtype=np.float64).view(np.int64)
    code = ((bits & np.int64(0x7FFF_FFFF_FFFF_FFFF)) >> SHIFT) - OFFSET  # (T,) fine bucket of |x|
    np.maximum(code, 0, out=code)  # everything below 2^-40 (and 0 itself) is bucket 0
    code = coarsened(code)
    negative = bits >> 63  # (T,) -1 for negative x, else 0
    code ^= negative
    code -= negative  # two's complement negation where x < 0
    return code


def bucket_value(bucket: ArrayLike) -> NDArray[np.float64]:
    """The representative value (midpoint) of each bucket: sign * 2^(e - 1023) * (1 + (k + h) / 64), where
    e and k are the exponent and mantissa bits of the bucket's first fine code plus 62911, and h is half
    its width in fine buckets (0.5 below 2^8, 4 from 2^8 on)."""
    bucket = np.asarray(bucket, dtype=np.int64)
    size = np.abs(bucket)
    coarse = size >= COARSE
    first_fine = np.where(coarse, COARSE + ((size - COARSE) << COARSE_BITS), size)
    half = np.where(coarse, (1 << COARSE_BITS) / 2, 0.5)
    code = first_fine + OFFSET
    exponent = (code >> MANTISSA_BITS) - 1023
    fraction = ((code & ((1 << MANTISSA_BITS) - 1)) + half) / (1 << MANTISSA_BITS)
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
