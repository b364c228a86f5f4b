"""The metrics of DOMAIN.md section 3: one documented table of name -> formula, pure numpy over tokens.

`a` = the method's estimate of log pi_prox, `g` = `prox_logp` (ground truth), `b` = `behave_logp`,
`t` = `theta_logp`; float64 `[n_tokens]` arrays. Coverage: metrics with `needs_truth` count only tokens
with `g` (not NaN); the others count every token where the estimate exists.

| metric | formula | needs g |
| --- | --- | --- |
| `approx_logp` | `a` | no |
| `abs_error` | `abs(a - g)` | yes |
| `rel_error` | `abs(a - g) / (abs(g) + 1e-8)` | yes |
| `squared_error` | `(a - g)^2` | yes |
| `behave_imp_weight` | `exp(a - b)` | no |
| `behave_imp_weight_abs_error` | `abs(exp(a - b) - exp(g - b))` | yes |
| `behave_imp_weight_rel_error` | `abs(exp(a - b) - exp(g - b)) / (exp(g - b) + 1e-8)` | yes |
| `importance_weight` | `exp(t - a)` | no |
| `importance_weight_abs_error` | `abs(exp(t - a) - exp(t - g))` | yes |
| `importance_weight_rel_error` | `abs(exp(t - a) - exp(t - g)) / (exp(t - g) + 1e-8)` | yes |
| `drift` | `abs(g - b)` (method `ground_truth` only) | yes |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]
EPS = 1e-8


class Terms:
    """The shared terms of one method's metrics on one set of tokens, each computed once on first use.

    Terms ending in `_g` live on the tokens that have the ground truth (`has_truth`)."""

    def __init__(self, *, a: F64, b: F64, t: F64, g: F64) -> None:
        shapes = {np.shape(x) for x in (a, b, t, g)}
        if len(shapes) != 1:
            raise ValueError(f"a, b, t, g must have one shape, got {[np.shape(x) for x in (a, b, t, g)]}")
        self.a, self.b, self.t, self.g = a, b, t, g
        self.has_truth = ~np.isnan(g)  # (T,)
        self.all_truth = bool(self.has_truth.all())

    def _on_truth(self, x: F64) -> F64:
        return x if self.all_truth else x[self.has_truth]

    @cached_property
    def behave_weight(self) -> F64:  # exp(a - b), every token
        return np.exp(self.a - self.b)

    @cached_property
    def importance_weight(self) -> F64:  # exp(t - a), every token
        return np.exp(self.t - self.a)

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
    def true_behave_weight_g(self) -> F64:  # exp(g - b)
        return np.exp(self.g_g - self.b_g)

    @cached_property
    def true_importance_weight_g(self) -> F64:  # exp(t - g)
        return np.exp(self._on_truth(self.t) - self.g_g)

    @cached_property
    def behave_weight_abs_error_g(self) -> F64:
        return np.abs(self._on_truth(self.behave_weight) - self.true_behave_weight_g)

    @cached_property
    def importance_weight_abs_error_g(self) -> F64:
        return np.abs(self._on_truth(self.importance_weight) - self.true_importance_weight_g)


@dataclass(frozen=True)
class Metric:
    name: str
    formula: str
    needs_truth: bool
    value: Callable[[Terms], F64]


METRIC_TABLE: tuple[Metric, ...] = (
    Metric("approx_logp", "a", False, lambda x: x.a),
    Metric("abs_error", "abs(a - g)", True, lambda x: x.abs_error_g),
    Metric(
        "rel_error", "abs(a - g) / (abs(g) + 1e-8)", True, lambda x: x.abs_error_g / (np.abs(x.g_g) + EPS)
    ),
    Metric("squared_error", "(a - g)^2", True, lambda x: np.square(x.a_g - x.g_g)),
    Metric("behave_imp_weight", "exp(a - b)", False, lambda x: x.behave_weight),
    Metric(
        "behave_imp_weight_abs_error",
        "abs(exp(a - b) - exp(g - b))",
        True,
        lambda x: x.behave_weight_abs_error_g,
    ),
    Metric(
        "behave_imp_weight_rel_error",
        "abs(exp(a - b) - exp(g - b)) / (exp(g - b) + 1e-8)",
        True,
        lambda x: x.behave_weight_abs_error_g / (x.true_behave_weight_g + EPS),
    ),
    Metric("importance_weight", "exp(t - a)", False, lambda x: x.importance_weight),
    Metric(
        "importance_weight_abs_error",
        "abs(exp(t - a) - exp(t - g))",
        True,
        lambda x: x.importance_weight_abs_error_g,
    ),
    Metric(
        "importance_weight_rel_error",
        "abs(exp(t - a) - exp(t - g)) / (exp(t - g) + 1e-8)",
        True,
        lambda x: x.importance_weight_abs_error_g / (x.true_importance_weight_g + EPS),
    ),
    Metric("drift", "abs(g - b)", True, lambda x: np.abs(x.g_g - x.b_g)),
)
METRICS_BY_NAME: dict[str, Metric] = {m.name: m for m in METRIC_TABLE}


def metrics_for(method: str) -> tuple[Metric, ...]:
    """The metrics reported for `method`: all but `drift`, which belongs to `ground_truth` alone."""
    return tuple(m for m in METRIC_TABLE if m.name != "drift" or method == "ground_truth")


def metric_values(method: str, *, a: F64, b: F64, t: F64, g: F64) -> dict[str, F64]:
    """Every metric of `method` on the given tokens: truth metrics over tokens with `g`, others over all."""
    terms = Terms(a=a, b=b, t=t, g=g)
    return {m.name: m.value(terms) for m in metrics_for(method)}
