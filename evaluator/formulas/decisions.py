"""Where an estimate of log pi_prox reaches the gradient (DOMAIN.md sections 1 and 3b): pure numpy.

On a token that is neither clipped nor masked, the gradient of the decoupled loss is
`-A * exp(theta - behave) * grad log pi_theta`: `prox` cancels. So the estimate `x` of `prox` matters only
through PPO's clip, the behaviour-weight bound `U`, and how much a clamped weight is scaled. Arrays are
float64 `[n_tokens]` log-probs (`theta`, `behave`, `x`); `advantage` is `[n_tokens]` or None (no
advantage in the log: |A| = 1 and the clip is two-sided).

    clip_active(x)  = (A > 0 and exp(t - x) > 1 + eps_high) or (A < 0 and exp(t - x) < 1 - eps_low)
                      (without A: exp(t - x) outside [1 - eps_low, 1 + eps_high])
    bound_active(x) = exp(x - b) > U
    grad_weight(x)  = |A| exp(t - b) (1 - clip_active(x)) (1 - bound_active(x))          bound action mask
                    = |A| min(exp(x - b), U) exp(t - x) (1 - clip_active(x))              bound action clamp

Weights are `exp` of a log-ratio clamped to [-LOG_WEIGHT_MAX, LOG_WEIGHT_MAX] (see `weight`), so that
every figure stays finite for extreme but valid log-probs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from evaluator.formulas import F64, Flags

LOG_WEIGHT_MAX = 150.0
"""A weight exp(d) is computed as exp(min(d, 150)): 1.4e65 at most, so that a product of two weights and
its square still fit a float64 sum. A token whose log-ratio passes 150 nats (a probability ratio beyond
1e65) is counted at that weight: its clip and bound decisions are unchanged (far past any threshold),
only the size is capped."""

BoundAction = Literal["mask", "clamp"]


@dataclass(frozen=True)
class DecisionParams:
    """The loss's thresholds (DOMAIN.md 3b defaults); recorded in the store with every replay."""

    eps_low: float = 0.2
    """the ratio exp(theta - prox) is clipped below at 1 - eps_low"""
    eps_high: float = 0.2
    """... and above at 1 + eps_high"""
    bound: float = 5.0
    """U: the behaviour weight exp(prox - behave) above which a token is masked or clamped"""
    bound_action: BoundAction = "mask"
    """what happens above U: the token leaves the loss (`mask`, AReaL's legacy cap) or its weight is
    clamped to U (`clamp`)"""

    def __post_init__(self) -> None:
        if not (0 <= self.eps_low < 1 and self.eps_high >= 0 and self.bound > 0):
            raise ValueError(f"need 0 <= eps_low < 1, eps_high >= 0 and bound > 0, got {self}")
        if self.bound_action not in ("mask", "clamp"):
            raise ValueError(f"bound_action must be mask or clamp, got {self.bound_action!r}")


DEFAULT_PARAMS = DecisionParams()


def weight(log_ratio: F64) -> F64:
    """exp(min(log_ratio, LOG_WEIGHT_MAX)): a probability ratio, finite whatever the log-probs."""
    return np.exp(np.minimum(log_ratio, LOG_WEIGHT_MAX))


def clip_active(ratio: F64, advantage: F64 | None, p: DecisionParams) -> Flags:
    """True where PPO's clip turns the token's gradient off, for the ratio exp(theta - x): one-sided by
    the sign of A, two-sided where there is no advantage (None, or NaN on a row)."""
    above, below = ratio > 1 + p.eps_high, ratio < 1 - p.eps_low
    if advantage is None:
        return above | below
    one_sided = ((advantage > 0) & above) | ((advantage < 0) & below)
    return np.where(np.isnan(advantage), above | below, one_sided)


def bound_active(behave_weight: F64, p: DecisionParams) -> Flags:
    """True where the behaviour weight exp(x - behave) passes the bound U."""
    return behave_weight > p.bound


def grad_weight(
    off_policy_weight: F64, ratio: F64, clipped: Flags, bounded: Flags,
    abs_advantage: F64 | float, p: DecisionParams,
) -> F64:  # fmt: skip
    """The token's gradient coefficient W(x) from exp(theta - behave) (`off_policy_weight`, the same for
    every estimate), the ratio exp(theta - x) and x's decisions:
    `mask`: |A| exp(t - b) unless clipped or bounded; `clamp`: |A| min(exp(x - b), U) exp(t - x) unless
    clipped, that is |A| exp(t - b) below U and |A| U exp(t - x) above it. An estimate that flips no
    decision has exactly the true W."""
    if p.bound_action == "mask":
        return np.where(clipped | bounded, 0.0, abs_advantage * off_policy_weight)
    return np.where(clipped, 0.0, abs_advantage * np.where(bounded, p.bound * ratio, off_policy_weight))
