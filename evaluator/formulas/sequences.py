"""What every loss decision shares: the capped weight `w(d)` and the tokens' sequences (their sums, means,
maxima per sequence, and the minibatch each belongs to). Pure numpy."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numpy.typing import NDArray

from evaluator.formulas import F64, Flags

LOG_WEIGHT_MAX = 150.0
"""A weight exp(d) is computed as exp(min(d, 150)): 1.4e65 at most, so that a product of two weights and
its square still fit a float64 sum. A token whose log-ratio passes 150 nats (a probability ratio beyond
1e65) is counted at that weight: its clip and bound decisions are unchanged (far past any threshold),
only the size is capped."""


def weight(log_ratio: F64) -> F64:
    """exp(min(log_ratio, LOG_WEIGHT_MAX)): a probability ratio, finite whatever the log-probs."""
    return np.exp(np.minimum(log_ratio, LOG_WEIGHT_MAX))


@dataclass(frozen=True)
class Sequences:
    """The sequence `(run_id, seq_id, minibatch)` of each token: codes `[n_tokens]` in 0..n-1; `group`
    `[n]` the minibatch `(run_id, step, minibatch)` of each sequence (None: one minibatch)."""

    code: NDArray[np.int64]
    n: int
    group: NDArray[np.int64] | None = None

    def take(self, mask: Flags | None) -> Sequences:
        return self if mask is None else Sequences(self.code[mask], self.n, self.group)

    def minibatch(self) -> NDArray[np.int64]:
        """`[n_tokens]` each token's minibatch code."""
        return np.zeros(len(self.code), dtype=np.int64) if self.group is None else self.group[self.code]

    def sum(self, values: F64 | Flags) -> F64:
        """`[n]` per-sequence sums."""
        return np.bincount(self.code, weights=values, minlength=self.n)

    def max(self, values: F64) -> F64:
        out = np.full(self.n, -np.inf)
        np.maximum.at(out, self.code, values)
        return out

    def min(self, values: F64) -> F64:
        out = np.full(self.n, np.inf)
        np.minimum.at(out, self.code, values)
        return out

    @cached_property
    def counts(self) -> F64:
        """`[n]` each sequence's number of tokens."""
        return np.bincount(self.code, minlength=self.n).astype(np.float64)

    def mean(self, values: F64, where: Flags | None = None) -> tuple[F64, F64]:
        """(`[n]` means over the tokens `where` (all), `[n]` their counts); a sequence with none: mean 0."""
        count = self.counts if where is None else self.sum(where)
        total = self.sum(values if where is None else np.where(where, values, 0.0))
        return total / np.maximum(count, 1.0), count
