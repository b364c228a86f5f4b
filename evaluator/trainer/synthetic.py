"""Synthetic token logs of schema v1 with a known generating model, for tests and the benchmark.

Real logs come from the reference trainer (`evaluator.trainer`); these are for scale and for
hand-checkable structure. Each token's log-prob is a smooth function of the policy version,

    logp(v) = log_sigmoid(u + slope * (v - step) + curvature * (v - step)^2),

so interpolating in version is close to, but not exactly, right (as in real training). The inference
engine adds a small mismatch to the log-probs it reports (`behave_logp`, `proximal_t_logp`). Responses
are split into abort-resume segments whose versions rise by one per resume; `proximal_t` follows
DOMAIN.md section 4 (version + 1 for tokens followed by a later segment, own log-prob in the last).
Responses come in GRPO groups of consecutive `seq_id`s (one prompt each): a 0/1 reward per response, the
advantage `(r - mean) / (std + 1e-6)` of its group; the updates within a step make the trained tokens of
positive-advantage responses more likely (`learning`), as a trainer that trains on its advantages does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from evaluator.logio import token_table


@dataclass(frozen=True)
class SyntheticSpec:
    run_id: str = "synthetic"
    """`run_id` of every row."""
    seed: int = 0
    """Seed of the generator; each chunk of steps derives its own stream from (seed, first step)."""
    tokens_per_step: int = 4096
    """Response tokens generated for each trainer step (approximately: whole responses)."""
    mean_length: int = 48
    """Mean response length; lengths are uniform on [4, 2 * mean_length - 4]."""
    max_staleness: int = 8
    """Largest `step - behave_version` of a response's first segment."""
    n_minibatches: int = 4
    """PPO minibatches per step; each response goes to one at random."""
    resume_fraction: float = 0.3
    """Fraction of responses interrupted by weight updates (2 or 3 segments)."""
    engine_mismatch: float = 0.02
    """Std of the inference engine's logit noise against the trainer (bf16 vs fp32, kernels)."""
    drift: float = 0.08
    """Std of each token's logit slope per version: how fast the policy moves."""
    prox_every: int = 1
    """Record `prox_logp` on every k-th step only (0: never, as a run trained without recompute)."""
    with_proximal_t: bool = True
    """Write `proximal_t_logp` and `proximal_t_version`."""
    proximal_t_bug: Literal["none", "not_updated", "overwritten"] = "none"
    """A bug in proximal_t's values (its recorded version stays behave_version + 1): `not_updated` keeps
    the log-prob of behave_version (recomputed, so not bit-equal to behave_logp); `overwritten` gives every
    earlier segment the log-prob of the last segment's version (every resume overwrote every token,
    seeds/001). The proximal_t findings catch both."""
    weights_offset: int = 0
    """A bug: the trainer's forward passes (prox and theta) run on the weights of version step +
    weights_offset (-1: the step's update never loaded). The findings catch it (`version_count`)."""
    loss_mask_drop: float = 0.02
    """Fraction of tokens with `loss_mask` false."""
    group_size: int = 8
    """Responses per prompt (GRPO group: consecutive seq_ids of one step; a step's last group may be
    smaller)."""
    learning: float = 0.1
    """Logit change of a trained token per unit of advantage over one version of updates: theta at
    minibatch m is moved by `learning * advantage * m / n_minibatches` on `loss_mask` tokens."""


def _log_sigmoid(x: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -x)


def synthetic_steps(spec: SyntheticSpec, first_step: int, n_steps: int) -> pa.Table:
    """The rows of steps `[first_step, first_step + n_steps)`, sorted by step, minibatch, seq_id, pos."""
    rng = np.random.default_rng([spec.seed, first_step])
    lo, hi = 4, max(5, 2 * spec.mean_length - 4)
    n_seq_per_step = max(1, spec.tokens_per_step // spec.mean_length)
    S = n_steps * n_seq_per_step
    seq_step = first_step + np.repeat(np.arange(n_steps), n_seq_per_step)  # (S,)
    seq_id = seq_step * n_seq_per_step + np.tile(np.arange(n_seq_per_step), n_steps)  # unique in the run
    length = rng.integers(lo, hi + 1, size=S)  # (S,)
    first_staleness = rng.integers(0, np.minimum(seq_step, spec.max_staleness) + 1)  # (S,)
    resumed = rng.random(S) < spec.resume_fraction
    n_seg = np.where(resumed, rng.integers(2, 4, size=S), 1)
    n_seg = np.minimum(n_seg, np.minimum(first_staleness + 1, length))  # last version <= step
    minibatch = rng.integers(0, spec.n_minibatches, size=S)

    # Tokens: one row each.
    T = int(length.sum())
    seq_of = np.repeat(np.arange(S), length)  # (T,)
    start = np.cumsum(length) - length  # (S,)
    pos = np.arange(T) - start[seq_of]  # (T,)
    # Segment boundaries: n_seg - 1 distinct cut positions in [1, length) per response.
    key = seq_of + np.where(pos > 0, 0.999 * rng.random(T), 0.9999)  # position 0 never cuts
    order = np.argsort(key)  # grouped by response, random within it
    rank_in_seq = np.empty(T, dtype=np.int64)
    rank_in_seq[order] = np.arange(T) - start[seq_of[order]]
    is_cut = rank_in_seq < n_seg[seq_of] - 1
    boundary = np.zeros(T, dtype=np.int64)
    boundary[is_cut] = 1
    segment = np.cumsum(boundary) - np.cumsum(boundary)[start][seq_of]  # (T,)
    last_segment = np.maximum.reduceat(segment, start)[seq_of]
    step = seq_step[seq_of]
    behave_version = step - first_staleness[seq_of] + segment

    # The generating model: a smooth logit trajectory in version, anchored at the token's step.
    u = rng.normal(2.5, 2.0, T)
    slope = rng.normal(0.0, spec.drift, T)
    curvature = rng.normal(0.0, spec.drift / 10, T)

    def logp(version: np.ndarray, noise: float = 0.0, shift: np.ndarray | float = 0.0) -> np.ndarray:
        dv = version - step
        x = u + slope * dv + curvature * dv**2 + shift
        return _log_sigmoid(x + rng.normal(0.0, noise, T) * (noise > 0))

    mb = minibatch[seq_of]
    reward, advantage = _grpo(rng, n_steps, n_seq_per_step, spec.group_size)  # (S,) each
    loss_mask = rng.random(T) >= spec.loss_mask_drop
    behave_logp = logp(behave_version, spec.engine_mismatch)
    weights = step + float(spec.weights_offset)  # (T,) the version of the trainer's weights
    prox_logp = logp(weights)
    within = mb / spec.n_minibatches  # theta's place in version time after `mb` updates of the step
    theta_logp = logp(weights + within, shift=spec.learning * advantage[seq_of] * within * loss_mask)
    has_prox = (step % spec.prox_every == 0) if spec.prox_every > 0 else np.zeros(T, bool)
    columns = {
        "run_id": np.full(T, spec.run_id, dtype=object),
        "step": step,
        "minibatch": mb,
        "n_minibatches": np.full(T, spec.n_minibatches),
        "seq_id": seq_id[seq_of],
        "pos": pos,
        "token_id": rng.integers(0, 32000, size=T),
        "loss_mask": loss_mask,
        "behave_logp": behave_logp,
        "behave_version": behave_version,
        "prox_logp": np.where(has_prox, prox_logp, np.nan),
        "theta_logp": theta_logp,
        "advantage": advantage[seq_of],
        "reward": reward[seq_of],
    }
    if spec.with_proximal_t:
        followed = segment < last_segment
        carried = {
            "none": behave_version + 1.0,
            "not_updated": behave_version.astype(float),
            "overwritten": behave_version + (last_segment - segment).astype(float),
        }[spec.proximal_t_bug]
        columns["proximal_t_logp"] = np.where(followed, logp(carried, spec.engine_mismatch), behave_logp)
        columns["proximal_t_version"] = np.where(followed, behave_version + 1, behave_version)
    order = np.lexsort((pos, seq_of, mb, step))
    return token_table({name: values[order] for name, values in columns.items()})


def _grpo(rng: np.random.Generator, n_steps: int, per_step: int, group_size: int):
    """(reward, advantage) per response, float32: groups of `group_size` consecutive responses of a step,
    each with its own success rate; advantage = (r - group mean) / (group std + 1e-6), as GRPO."""
    response = np.arange(n_steps * per_step)  # (S,) in step order, seq_id order within a step
    in_step = response % per_step
    _, group = np.unique(response - in_step + in_step // max(1, group_size), return_inverse=True)
    success = rng.random(group.max() + 1)[group]
    reward = (rng.random(len(group)) < success).astype(np.float32)
    count = np.bincount(group).astype(np.float32)
    mean = (np.bincount(group, reward) / count).astype(np.float32)[group]
    var = np.bincount(group, (reward - mean) ** 2) / np.maximum(count - 1, 1)
    std = np.sqrt(var).astype(np.float32)[group]
    return reward, ((reward - mean) / (std + np.float32(1e-6))).astype(np.float32)


def write_synthetic_log(
    path: str | os.PathLike, n_tokens: int, spec: SyntheticSpec = SyntheticSpec(), first_step: int = 0
) -> int:
    """Stream a synthetic log of about `n_tokens` rows, its steps from `first_step` on, to `path`, a chunk
    of steps at a time (bounded memory). Returns the number of rows written."""
    n_steps = max(1, -(-n_tokens // spec.tokens_per_step))
    steps_per_chunk = max(1, (1 << 20) // spec.tokens_per_step)
    written = 0
    writer: pq.ParquetWriter | None = None
    try:
        for first in range(0, n_steps, steps_per_chunk):
            table = synthetic_steps(spec, first_step + first, min(steps_per_chunk, n_steps - first))
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema, compression="zstd")
            writer.write_table(table, row_group_size=1 << 20)
            written += table.num_rows
    finally:
        if writer is not None:
            writer.close()
    return written
