"""One series' sketch histograms over one record batch's tokens: numpy's `bincount` for a batch of fewer than
`COMPILED_FROM` tokens, the compiled loop (`evaluator.replay.kernels`, numba) for more.

Importing numba and loading the compiled loop cost about 0.5 CPU-seconds and 120 MiB, which a small file's
whole replay does not take; `bincount` costs 4-11 ns a token more than the loop (BENCHMARKS.md), so below
`COMPILED_FROM` tokens numpy wins. Counts are integers: both paths give the same arrays.
"""

from __future__ import annotations

import numpy as np

from evaluator.formulas.sketch import bucket_code

COMPILED_FROM = 1 << 16
"""A batch with at least this many tokens is counted by the compiled loop (numba is imported then)."""


def needs_compiled(n_rows: int) -> bool:
    """Can a file of `n_rows` rows have a batch for the compiled loop (a batch's tokens: its rows at most)?"""
    return n_rows >= COMPILED_FROM


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
    """Counts of the buckets lo .. lo + span - 1 of `values` (T,) per (run, step) row (n_step, span) and per
    (run, staleness) row (n_stale, span); token i is in group `group[i]`, whose rows are `step_of_group` and
    `stale_of_group` (`evaluator.replay.kernels.histograms`, which counts a batch of many tokens)."""
    if len(values) >= COMPILED_FROM:
        from evaluator.replay.kernels import histograms as compiled  # numba: imported on first use

        return compiled(values, group, step_of_group, stale_of_group, lo, span, n_step, n_stale)
    offsets = bucket_code(values) - lo
    by_step = np.bincount(step_of_group[group] * span + offsets, minlength=n_step * span)
    by_stale = np.bincount(stale_of_group[group] * span + offsets, minlength=n_stale * span)
    return by_step.astype(np.int64).reshape(n_step, span), by_stale.astype(np.int64).reshape(n_stale, span)
