"""The metrics of DOMAIN.md sections 3 and 3b: one documented table of name -> formula, pure numpy.

`a` = the method's estimate of log pi_prox, `g` = `prox_logp` (ground truth), `b` = `behave_logp`,
`t` = `theta_logp`, `A` = `advantage` (|A| = 1 without it); float64 `[n_tokens]` arrays. `w(d)` =
exp(min(d, 150)) (`evaluator.formulas.decisions.weight`), `clip`, `bound`, `W` the decisions of
`evaluator.formulas.decisions`. Coverage: metrics that need `g` count only tokens with it; the others
every token where the estimate exists. `for`: every method, the estimators only (`ground_truth` would
be 0), or the ground truth only. Binary metrics keep no quantile sketch (their quantiles say nothing).

| metric | formula | needs g | for |
| --- | --- | --- | --- |
| `approx_logp` | `a` | no | all |
| `abs_error` | `abs(a - g)` | yes | all |
| `rel_error` | `abs(a - g) / (abs(g) + 1e-8)` | yes | all |
| `squared_error` | `(a - g)^2` | yes | all |
| `behave_imp_weight` | `w(a - b)` | no | all |
| `behave_imp_weight_abs_error` | `abs(w(a - b) - w(g - b))` | yes | all |
| `behave_imp_weight_rel_error` | `abs(w(a - b) - w(g - b)) / (w(g - b) + 1e-8)` | yes | all |
| `importance_weight` | `w(t - a)` | no | all |
| `importance_weight_abs_error` | `abs(w(t - a) - w(t - g))` | yes | all |
| `importance_weight_rel_error` | `abs(w(t - a) - w(t - g)) / (w(t - g) + 1e-8)` | yes | all |
| `behave_approx_kl` | `a - b`, the log behaviour weight (KL estimators follow from its moments) | no | all |
| `clip_active` | `clip(a)`: 1 where PPO's clip turns the token's gradient off | yes | all |
| `clip_flip` | `clip(a) != clip(g)` | yes | estimators |
| `bound_active` | `bound(a)`: 1 where `w(a - b) > U` | yes | all |
| `bound_flip` | `bound(a) != bound(g)` | yes | estimators |
| `grad_weight` | `W(a)`, the token's gradient coefficient | yes | all |
| `grad_weight_abs_error` | `abs(W(a) - W(g))` | yes | estimators |
| `drift` | `abs(g - b)` | yes | ground_truth |
| `prob_drift` | `abs(exp(g) - exp(b))` (verl's rollout-vs-train probability gap) | yes | ground_truth |
| `exp_abs_drift` | `w(abs(g - b))` (NeMo-RL's exp of the absolute log-prob gap) | yes | ground_truth |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from evaluator.formulas.decisions import (
    DEFAULT_PARAMS,
    DecisionParams,
    bound_active,
    clip_active,
    grad_weight,
    weight,
)

F64 = NDArray[np.float64]
EPS = 1e-8


def _one_shape(**arrays: np.ndarray) -> None:
    if len({np.shape(x) for x in arrays.values()}) != 1:
        raise ValueError(
            f"{', '.join(arrays)} must have one shape, got { {k: np.shape(x) for k, x in arrays.items()} }"
        )


class Truth:
    """The ground truth's terms, shared by every method of one batch: computed once, on every token
    (meaningless where `g` is NaN; methods take them on the tokens with `g` only)."""

    def __init__(self, *, b: F64, t: F64, g: F64, advantage: F64 | None, params: DecisionParams) -> None:
        _one_shape(b=b, t=t, g=g, **({} if advantage is None else {"advantage": advantage}))
        self.b, self.t, self.g, self.advantage, self.params = b, t, g, advantage, params
        self.has_truth = ~np.isnan(g)  # (T,)

    @cached_property
    def abs_advantage(self) -> F64 | float:  # |A|, 1 where there is none
        return (
            1.0 if self.advantage is None else np.where(np.isnan(self.advantage), 1.0, np.abs(self.advantage))
        )

    @cached_property
    def behave_weight(self) -> F64:  # w(g - b)
        return weight(self.g - self.b)

    @cached_property
    def ratio(self) -> F64:  # w(t - g)
        return weight(self.t - self.g)

    @cached_property
    def off_policy_weight(self) -> F64:  # w(t - b)
        return weight(self.t - self.b)

    @cached_property
    def clip(self) -> NDArray[np.bool_]:
        return clip_active(self.ratio, self.advantage, self.params)

    @cached_property
    def bound(self) -> NDArray[np.bool_]:
        return bound_active(self.behave_weight, self.params)

    @cached_property
    def grad_weight(self) -> F64:
        return grad_weight(
            self.off_policy_weight, self.ratio, self.clip, self.bound, self.abs_advantage, self.params
        )


class Terms:
    """The shared terms of one method's metrics on the tokens where its estimate exists (`keep`: a mask
    of the batch's tokens, None for all), each computed once on first use. Terms ending in `_g` live on
    the tokens that also have the ground truth (`has_truth`)."""

    def __init__(self, a: F64, truth: Truth, keep: NDArray[np.bool_] | None = None) -> None:
        _one_shape(a=a, b=truth.b)
        self.truth, self.keep = truth, keep
        self.a_is = "g" if a is truth.g else "b" if a is truth.b else None  # ground truth, rollout
        self.a = a if keep is None else a[keep]
        self.b, self.t, self.g = (self._kept(x) for x in (truth.b, truth.t, truth.g))
        self.has_truth = self._kept(truth.has_truth)  # (T,)
        self.all_truth = bool(self.has_truth.all())
        self.params = truth.params

    def _kept(self, x):
        return x if self.keep is None or np.ndim(x) == 0 else x[self.keep]

    def _on_truth(self, x):
        return x if self.all_truth or np.ndim(x) == 0 else x[self.has_truth]

    def _truth_g(self, x):
        """One of the ground truth's terms on this method's tokens with the truth."""
        return self._on_truth(self._kept(x))

    @cached_property
    def behave_weight(self) -> F64:  # w(a - b), every token
        if self.a_is == "g":  # the same numbers, computed once
            return self._kept(self.truth.behave_weight)
        return np.ones_like(self.a) if self.a_is == "b" else weight(self.a - self.b)  # w(0) = 1

    @cached_property
    def importance_weight(self) -> F64:  # w(t - a), every token
        if self.a_is is not None:
            return self._kept(self.truth.ratio if self.a_is == "g" else self.truth.off_policy_weight)
        return weight(self.t - self.a)

    @cached_property
    def a_g(self) -> F64:
        return self._on_truth(self.a)

    @cached_property
    def g_g(self) -> F64:
        return self._on_truth(self.g)

    @cached_property
    def b_g(self) -> F64:
        return self._on_truth(self.b)

    @cached_property
    def abs_error_g(self) -> F64:  # abs(a - g)
        return np.abs(self.a_g - self.g_g)

    @cached_property
    def true_behave_weight_g(self) -> F64:  # w(g - b)
        return self._truth_g(self.truth.behave_weight)

    @cached_property
    def true_importance_weight_g(self) -> F64:  # w(t - g)
        return self._truth_g(self.truth.ratio)

    @cached_property
    def behave_weight_abs_error_g(self) -> F64:
        return np.abs(self._on_truth(self.behave_weight) - self.true_behave_weight_g)

    @cached_property
    def importance_weight_abs_error_g(self) -> F64:
        return np.abs(self._on_truth(self.importance_weight) - self.true_importance_weight_g)

    @cached_property
    def clip_g(self) -> NDArray[np.bool_]:  # clip(a)
        advantage = None if self.truth.advantage is None else self._truth_g(self.truth.advantage)
        return clip_active(self._on_truth(self.importance_weight), advantage, self.params)

    @cached_property
    def bound_g(self) -> NDArray[np.bool_]:  # bound(a)
        return bound_active(self._on_truth(self.behave_weight), self.params)

    @cached_property
    def grad_weight_g(self) -> F64:  # W(a)
        return grad_weight(
            self._truth_g(self.truth.off_policy_weight),
            self._on_truth(self.importance_weight),
            self.clip_g,
            self.bound_g,
            self._truth_g(self.truth.abs_advantage),
            self.params,
        )


For = Literal["all", "estimators", "ground_truth"]


@dataclass(frozen=True)
class Metric:
    name: str
    formula: str
    needs_truth: bool
    value: Callable[[Terms], F64]
    of: For = "all"
    sketch: bool = True
    """Keep a quantile sketch (False for 0/1 metrics, whose quantiles say nothing)."""


def _flag(x: NDArray[np.bool_]) -> F64:
    return x.astype(np.float64)


METRIC_TABLE: tuple[Metric, ...] = (
    Metric("approx_logp", "a", False, lambda x: x.a),
    Metric("abs_error", "abs(a - g)", True, lambda x: x.abs_error_g),
    Metric(
        "rel_error", "abs(a - g) / (abs(g) + 1e-8)", True, lambda x: x.abs_error_g / (np.abs(x.g_g) + EPS)
    ),
    Metric("squared_error", "(a - g)^2", True, lambda x: np.square(x.a_g - x.g_g)),
    Metric("behave_imp_weight", "w(a - b)", False, lambda x: x.behave_weight),
    Metric(
        "behave_imp_weight_abs_error",
        "abs(w(a - b) - w(g - b))",
        True,
        lambda x: x.behave_weight_abs_error_g,
    ),
    Metric(
        "behave_imp_weight_rel_error",
        "abs(w(a - b) - w(g - b)) / (w(g - b) + 1e-8)",
        True,
        lambda x: x.behave_weight_abs_error_g / (x.true_behave_weight_g + EPS),
    ),
    Metric("importance_weight", "w(t - a)", False, lambda x: x.importance_weight),
    Metric(
        "importance_weight_abs_error",
        "abs(w(t - a) - w(t - g))",
        True,
        lambda x: x.importance_weight_abs_error_g,
    ),
    Metric(
        "importance_weight_rel_error",
        "abs(w(t - a) - w(t - g)) / (w(t - g) + 1e-8)",
        True,
        lambda x: x.importance_weight_abs_error_g / (x.true_importance_weight_g + EPS),
    ),
    Metric("behave_approx_kl", "a - b", False, lambda x: x.a - x.b),
    Metric("clip_active", "clip(a)", True, lambda x: _flag(x.clip_g), sketch=False),
    Metric(
        "clip_flip",
        "clip(a) != clip(g)",
        True,
        lambda x: _flag(x.clip_g != x._truth_g(x.truth.clip)),
        of="estimators",
        sketch=False,
    ),
    Metric("bound_active", "bound(a)", True, lambda x: _flag(x.bound_g), sketch=False),
    Metric(
        "bound_flip",
        "bound(a) != bound(g)",
        True,
        lambda x: _flag(x.bound_g != x._truth_g(x.truth.bound)),
        of="estimators",
        sketch=False,
    ),
    Metric("grad_weight", "W(a)", True, lambda x: x.grad_weight_g),
    Metric(
        "grad_weight_abs_error",
        "abs(W(a) - W(g))",
        True,
        lambda x: np.abs(x.grad_weight_g - x._truth_g(x.truth.grad_weight)),
        of="estimators",
    ),
    Metric("drift", "abs(g - b)", True, lambda x: np.abs(x.g_g - x.b_g), of="ground_truth"),
    Metric(
        "prob_drift",
        "abs(exp(g) - exp(b))",
        True,
        lambda x: np.abs(np.exp(x.g_g) - np.exp(x.b_g)),
        of="ground_truth",
    ),
    Metric(
        "exp_abs_drift", "w(abs(g - b))", True, lambda x: weight(np.abs(x.g_g - x.b_g)), of="ground_truth"
    ),
)
METRICS_BY_NAME: dict[str, Metric] = {m.name: m for m in METRIC_TABLE}


def metrics_for(method: str) -> tuple[Metric, ...]:
    """The metrics reported for `method`."""
    kind = "ground_truth" if method == "ground_truth" else "estimators"
    return tuple(m for m in METRIC_TABLE if m.of in ("all", kind))


def metric_values(
    method: str,
    *,
    a: F64,
    b: F64,
    t: F64,
    g: F64,
    advantage: F64 | None = None,
    params: DecisionParams = DEFAULT_PARAMS,
) -> dict[str, F64]:
    """Every metric of `method` on the given tokens: truth metrics over tokens with `g`, others over all."""
    terms = Terms(a, Truth(b=b, t=t, g=g, advantage=advantage, params=params))
    return {m.name: m.value(terms) for m in metrics_for(method)}
