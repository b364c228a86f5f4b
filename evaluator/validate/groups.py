"""GRPO groups in a sample of whole blocks of responses (`evaluator.validate.block_sample`): the
responses to one prompt, found from the log alone, and what the advantage does within them.

A log has no prompt id, but trainers number a group's responses consecutively (AReaL, the reference
trainer), so a group is a block of `size` consecutive responses of a step in `seq_id` order (size 0: the
whole step). Within a true group an outcome advantage is a non-decreasing function of the reward (GRPO's
`(r - mean) / std`, RLOO, Dr. GRPO; REINFORCE++ over the whole step): equal rewards get equal advantages.
For every candidate size this module counts, per run, the pairs of neighbours (responses sorted by reward
within a block) with equal rewards and how many of them carry different advantages; pairs with rising
rewards and whether the advantage rises (concordant) or falls (discordant); complete blocks and how many
are not centred (their mean advantage off zero); and the sums of the within-block correlation of
advantage and reward. The findings (`evaluator.validate.check_advantage`) take the largest size with
equal rewards mapped to equal advantages as the group.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from evaluator.validate.block_sample import BlockSample
from evaluator.validate.shapes import EXAMPLES, Responses, example_table

SIZES = (*range(2, 17), 20, 24, 32, 48, 64, 128, 0)
"""Candidate group sizes (0: the whole step)."""
SAME_ADVANTAGE = 1e-4
"""Advantages closer than this (relative to the run's RMS advantage) count as equal: one float32
formula applied to equal rewards gives bit-equal values; this only absorbs a reordered sum."""
CENTRE = 0.1
"""A group whose mean advantage is off zero by more than this share of the run's RMS advantage is not
centred (the clean runs: 0 to 0.03, the float32 residue of `(r - mean) / (std + eps)` on equal rewards)."""


def group_stats(s: BlockSample, r: Responses) -> tuple[pa.Table, pa.Table]:
    """(per (run, size): the counts above; examples of blocks off centre and of discordant pairs)."""
    first = np.ones(len(r.run), dtype=bool)  # a response's first minibatch only (PPO epochs repeat it)
    step, seq = s.first(s.x["step"]), s.first(s.x["seq_id"])
    first[1:] = (r.run[1:] != r.run[:-1]) | (step[1:] != step[:-1]) | (seq[1:] != seq[:-1])
    keep = first & np.isfinite(r.a_resp)
    index = np.flatnonzero(keep)
    run, step, a, reward = r.run[keep], step[keep], r.a_resp[keep], r.r[keep]
    new_step = np.r_[True, (run[1:] != run[:-1]) | (step[1:] != step[:-1])] if len(run) else run
    rank = np.arange(len(run)) - np.maximum.accumulate(np.where(new_step, np.arange(len(run)), 0))
    k = len(s.run_ids)
    rms = np.sqrt(np.bincount(run, a * a, minlength=k) / np.maximum(1, np.bincount(run, minlength=k)))
    tol = SAME_ADVANTAGE * rms[run]
    parts, examples = [], []
    for size in SIZES:
        block = np.cumsum(new_step) * (1 << 20) + (rank // size if size else 0)  # unique per (run, step)
        counts, discordant = _pairs(run, block, a, reward, tol, k)
        centre, off = _centring(run, block, a, reward, size, rms)
        parts.append(pa.table({"run_id": s.run_ids, "size": [size] * k, **counts, **centre}))
        examples += [(f"group_off_centre:{size}", index[i]) for i in off[:EXAMPLES]]
        examples += [(f"group_discordant:{size}", index[i]) for i in discordant[:EXAMPLES]]
    rows = [(kind, i, max(0, int(r.lead[i]))) for kind, i in examples]
    return pa.concat_tables(parts), example_table(s, rows)


def _per_run(run: np.ndarray, values: np.ndarray, k: int) -> np.ndarray:
    return np.bincount(run, values.astype(np.float64), minlength=k)


def _pairs(run, block, a, reward, tol, k: int) -> tuple[dict, np.ndarray]:
    """Neighbours within a block once sorted by (reward, advantage): equal rewards with unequal
    advantages (violations); rising rewards with rising (concordant) or falling (discordant) advantage."""
    order = np.lexsort((a, reward, block))
    b, rw, av, t = block[order], reward[order], a[order], tol[order]
    same = np.r_[b[1:] == b[:-1], False] & np.isfinite(rw) & np.isfinite(np.r_[rw[1:], np.nan])
    up = np.r_[rw[1:], np.nan] - rw
    step_a = np.r_[av[1:], np.nan] - av
    equal, rising = same & (up == 0), same & (up > 0)
    violation = equal & (np.abs(step_a) > t)
    discordant = rising & (step_a < -t)
    runs = run[order]
    counts = {
        "pairs_equal": _per_run(runs, equal, k),
        "violations": _per_run(runs, violation, k),
        "concordant": _per_run(runs, rising & (step_a > t), k),
        "discordant": _per_run(runs, discordant, k),
    }
    return counts, order[np.flatnonzero(discordant)]


def _centring(run, block, a, reward, size, rms) -> tuple[dict, np.ndarray]:
    """Complete blocks (size responses, or a whole step), how many have a mean advantage off zero, and the
    within-block sums of the correlation of advantage and reward."""
    k = len(rms)
    _, slot, members = np.unique(block, return_inverse=True, return_counts=True)
    complete = members[slot] == size if size else np.ones(len(a), dtype=bool)
    mean_a = np.bincount(slot, a) / members
    first = np.r_[True, slot[1:] != slot[:-1]][: len(slot)] & complete
    off = first & (np.abs(mean_a[slot]) > CENTRE * rms[run])
    with_r = np.isfinite(reward)
    n_r = np.bincount(slot, with_r, minlength=len(members))
    mean_r = np.bincount(slot, np.where(with_r, reward, 0.0), minlength=len(members)) / np.maximum(n_r, 1)
    xa, yr = np.where(with_r, a - mean_a[slot], 0.0), np.where(with_r, reward - mean_r[slot], 0.0)
    sums = {
        "blocks": _per_run(run, first, k),
        "in_blocks": _per_run(run, complete, k),
        "off_centre": _per_run(run, off, k),
        "n_corr": _per_run(run, with_r, k),
        "sxy": _per_run(run, xa * yr, k),
        "sxx": _per_run(run, xa * xa, k),
        "syy": _per_run(run, yr * yr, k),
    }
    return sums, np.flatnonzero(off)
