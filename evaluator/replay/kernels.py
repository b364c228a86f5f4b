"""Compiled loop of replay's hot path (numba, cached on disk after the first run): one series' sketch
histograms over one record batch's tokens.

`histograms` computes each token's sketch bucket (`evaluator.formulas.sketch.bucket_code`, from the float's
bits) and counts it in its (run, step, staleness) group's row, then adds each group's row into its (run,
step) row and its (run, staleness) row; when those group rows would outnumber the tokens, it counts each
token in its two rows directly. One pass over the values instead of a bucket array, a key array and a
bincount over them. Counts are integers: the same whichever way they are taken.

Importing numba and the first call of a process (loading the compiled code from numba's cache) take
about 0.7 s; replay does both in a thread while it validates (`evaluator.replay.workers.load_kernels`), when
a file is long enough to need it (`evaluator.replay.histograms`: numpy counts a small batch).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from evaluator.formulas.sketch import COARSE, COARSE_BITS, OFFSET, SHIFT

_OFFSET, _SHIFT = np.int64(OFFSET), np.int64(SHIFT)
_COARSE, _COARSE_BITS = np.int64(COARSE), np.int64(COARSE_BITS)
_ABS = np.int64(0x7FFF_FFFF_FFFF_FFFF)


@nb.njit(cache=True, nogil=True)
def _offsets(values: np.ndarray, lo: int) -> np.ndarray:
    """bucket_code(values) - lo."""
    bits = values.view(np.int64)
    out = np.empty(len(bits), dtype=np.int64)
    for i in range(len(bits)):
        code = max(((bits[i] & _ABS) >> _SHIFT) - _OFFSET, 0)  # fine bucket of |x|; 0 below 2^-40
        if code >= _COARSE:  # 8 fine buckets make one from 2^8 on
            code = _COARSE + ((code - _COARSE) >> _COARSE_BITS)
        negative = bits[i] >> 63  # -1 for x < 0, else 0
        out[i] = ((code ^ negative) - negative) - lo
    return out


@nb.njit(cache=True, nogil=True)
def histograms(
    values: np.ndarray,
    group: np.ndarray,
    step_of_group: np.ndarray,
    stale_of_group: np.ndarray,
    lo: int,
    span: int,
    n_step: int,
    n_stale: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Counts of the buckets lo .. lo + span - 1 of `values` (T,) per (run, step) row (n_step, span) and
    per (run, staleness) row (n_stale, span); token i is in group `group[i]`, whose rows are
    `step_of_group` and `stale_of_group`. Every value's bucket must lie in that range (no NaN)."""
    offsets = _offsets(values, lo)
    n_groups = len(step_of_group)
    by_step = np.zeros(n_step * span, dtype=np.int64)
    by_stale = np.zeros(n_stale * span, dtype=np.int64)
    if n_groups * span <= len(values):  # the group rows are no larger than the tokens
        finest = np.zeros(n_groups * span, dtype=np.int64)
        for i in range(len(offsets)):
            finest[group[i] * span + offsets[i]] += 1
        for g in range(n_groups):
            step_row, stale_row, row = step_of_group[g] * span, stale_of_group[g] * span, g * span
            for k in range(span):
                by_step[step_row + k] += finest[row + k]
                by_stale[stale_row + k] += finest[row + k]
    else:
        for i in range(len(offsets)):
            g = group[i]
            by_step[step_of_group[g] * span + offsets[i]] += 1
            by_stale[stale_of_group[g] * span + offsets[i]] += 1
    return by_step.reshape(n_step, span), by_stale.reshape(n_stale, span)


def load() -> None:
    """Load the compiled loop now (a first call on a one-token input)."""
    one = np.zeros(1, dtype=np.int64)
    histograms(np.zeros(1), one, one, one, 0, 1, 1, 1)
