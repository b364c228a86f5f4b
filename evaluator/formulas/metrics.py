"""The per-token metrics of DOMAIN.md sections 3 and 3b, computed by name: pure numpy.

`schemas.store.METRIC_TABLE` defines every metric (its formula, whether it needs the ground truth, which
methods have it); `VALUES` here computes each from the terms of one estimate and of the truth.

The token sets (one mask model): a batch's loss tokens; of them, a method's **estimated** tokens (where its
estimate of log pi_prox exists, not NaN) and its **judged** tokens (estimated, and `prox_logp` known). A
metric that needs the truth is counted on the judged tokens, the others on the estimated ones.
`coverage` gives both sets of a method, `method_metrics` every metric of it on its set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar

import numpy as np

from evaluator.formulas import F64, Flags, check_shapes
from evaluator.formulas.decisions import (
    DEFAULT_PARAMS,
    DecisionParams,
    bound_active,
    clip_active,
    grad_weight,
    weight,
)
from schemas.store import METRIC_TABLE, Metric, metrics_for

EPS = 1e-8
T = TypeVar("T")


@dataclass(frozen=True)
class Tokens:
    """The log's columns on one set of tokens, float64 `[n]`: `b` = `behave_logp`, `t` = `theta_logp`,
    `g` = `prox_logp` (NaN where not recomputed), `advantage` (None: the log has none)."""

    b: F64
    t: F64
    g: F64
    advantage: F64 | None = None
    off_policy_weight: F64 = field(init=False)  # w(t - b): the same for every estimate
    abs_advantage: F64 | float = field(init=False)  # |A|, 1 where there is none

    def __post_init__(self) -> None:
        check_shapes(b=self.b, t=self.t, g=self.g, advantage=self.advantage)
        object.__setattr__(self, "off_policy_weight", weight(self.t - self.b))
        a = self.advantage
        object.__setattr__(self, "abs_advantage", 1.0 if a is None else np.where(np.isnan(a), 1.0, np.abs(a)))

    def take(self, mask: Flags | None) -> Tokens:
        """These tokens where `mask` is true (all of them for None)."""
        if mask is None:
            return self
        out = object.__new__(Tokens)
        for name in ("b", "t", "g", "advantage", "off_policy_weight", "abs_advantage"):
            value = getattr(self, name)
            object.__setattr__(out, name, value if value is None or np.ndim(value) == 0 else value[mask])
        return out


@dataclass(frozen=True)
class ProxTerms:
    """What follows from one log pi_prox `x` (an estimate, or the truth `g`) on a set of tokens: the
    behaviour weight w(x - b), the ratio w(t - x), the loss's clip and bound decisions and the gradient
    weight W(x) (`evaluator.formulas.decisions`)."""

    x: F64
    tokens: Tokens
    behave_weight: F64
    ratio: F64
    clip: Flags
    bound: Flags
    grad_weight: F64

    def take(self, mask: Flags | None) -> ProxTerms:
        """These terms where `mask` is true (all of them for None)."""
        if mask is None:
            return self
        arrays = (self.x, self.behave_weight, self.ratio, self.clip, self.bound, self.grad_weight)
        return ProxTerms(arrays[0][mask], self.tokens.take(mask), *(a[mask] for a in arrays[1:]))


def prox_terms(
    x: F64, tokens: Tokens, params: DecisionParams, *, behave_weight: F64 | None = None,
    ratio: F64 | None = None,
) -> ProxTerms:  # fmt: skip
    """The terms of `x` on `tokens`; `behave_weight` and `ratio` may be given when already known (for
    x = b they are 1 and the tokens' off-policy weight)."""
    behave_weight = weight(x - tokens.b) if behave_weight is None else behave_weight
    ratio = weight(tokens.t - x) if ratio is None else ratio
    clip = clip_active(ratio, tokens.advantage, params)
    bound = bound_active(behave_weight, params)
    grad = grad_weight(tokens.off_policy_weight, ratio, clip, bound, tokens.abs_advantage, params)
    return ProxTerms(x, tokens, behave_weight, ratio, clip, bound, grad)


def _flag(x: Flags) -> F64:
    return x.astype(np.float64)


# Each metric of METRIC_TABLE from the estimate's terms `e` and the truth's `g` on the same tokens (`g` is
# None for a metric that does not need the truth).
Value = Callable[[ProxTerms, ProxTerms | None], F64]
VALUES: dict[str, Value] = {
    "approx_logp": lambda e, g: e.x,
    "abs_error": lambda e, g: np.abs(e.x - g.x),
    "rel_error": lambda e, g: np.abs(e.x - g.x) / (np.abs(g.x) + EPS),
    "squared_error": lambda e, g: np.square(e.x - g.x),
    "behave_imp_weight": lambda e, g: e.behave_weight,
    "behave_imp_weight_abs_error": lambda e, g: np.abs(e.behave_weight - g.behave_weight),
    "behave_imp_weight_rel_error": lambda e, g: (
        np.abs(e.behave_weight - g.behave_weight) / (g.behave_weight + EPS)
    ),
    "importance_weight": lambda e, g: e.ratio,
    "importance_weight_abs_error": lambda e, g: np.abs(e.ratio - g.ratio),
    "importance_weight_rel_error": lambda e, g: np.abs(e.ratio - g.ratio) / (g.ratio + EPS),
    "behave_approx_kl": lambda e, g: e.x - e.tokens.b,
    "clip_active": lambda e, g: _flag(e.clip),
    "clip_flip": lambda e, g: _flag(e.clip != g.clip),
    "bound_active": lambda e, g: _flag(e.bound),
    "bound_flip": lambda e, g: _flag(e.bound != g.bound),
    "grad_weight": lambda e, g: e.grad_weight,
    "grad_weight_abs_error": lambda e, g: np.abs(e.grad_weight - g.grad_weight),
    "drift": lambda e, g: np.abs(g.x - g.tokens.b),
    "prob_drift": lambda e, g: np.abs(np.exp(g.x) - np.exp(g.tokens.b)),
    "exp_abs_drift": lambda e, g: weight(np.abs(g.x - g.tokens.b)),
}
assert set(VALUES) == {m.name for m in METRIC_TABLE}, "every metric of the table has one formula here"


class Coverage(NamedTuple, Generic[T]):
    """A method's two token sets, as masks of a batch's tokens (None: every token) or anything kept per
    set (the tokens' groups)."""

    estimated: T
    """where its estimate of log pi_prox exists: metrics that do not need the truth are counted here"""
    judged: T
    """estimated, and `prox_logp` known: metrics that need the truth are counted here"""

    def of(self, metric: Metric) -> T:
        """The tokens `metric` is counted on."""
        return self.judged if metric.needs_truth else self.estimated


def coverage(method: str, estimate: F64, prox_logp: F64) -> Coverage[Flags | None]:
    """The estimated and judged tokens of `method` (NaN marks a missing estimate or truth)."""
    has_truth = ~np.isnan(prox_logp)
    estimated = has_truth if method == "ground_truth" else ~np.isnan(estimate)
    judged = estimated & has_truth
    return Coverage(*(None if mask.all() else mask for mask in (estimated, judged)))


def method_metrics(
    method: str,
    estimate: F64,
    tokens: Tokens,
    truth: ProxTerms,
    params: DecisionParams,
    on: Coverage[Flags | None],
) -> Iterator[tuple[Metric, F64]]:
    """Every metric of `method` (`schemas.store.metrics_for`) on `tokens`, each on its tokens of `on`
    (`coverage`). `truth`: the terms of `prox_logp` on every token of `tokens`."""
    if method == "ground_truth":  # the truth's own terms, computed once
        est = truth.take(on.estimated)
    elif method == "rollout":  # x = b on every token: w(x - b) = 1 and w(t - x) = w(t - b), known
        ones = np.ones_like(estimate)
        est = prox_terms(estimate, tokens, params, behave_weight=ones, ratio=tokens.off_policy_weight)
    else:
        x = estimate if on.estimated is None else estimate[on.estimated]
        est = prox_terms(x, tokens.take(on.estimated), params)
    judged_of_estimated = None
    if on.judged is not None:
        judged_of_estimated = on.judged if on.estimated is None else on.judged[on.estimated]
    est_judged, truth_judged = est.take(judged_of_estimated), truth.take(on.judged)
    for metric in metrics_for(method):
        if metric.needs_truth:
            yield metric, VALUES[metric.name](est_judged, truth_judged)
        else:
            yield metric, VALUES[metric.name](est, None)


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
    """Every metric of `method` on the given tokens: those that need the truth on the tokens with `g`, the
    others on every token where the estimate `a` exists."""
    check_shapes(a=a, b=b)
    tokens = Tokens(b=b, t=t, g=g, advantage=advantage)
    truth = prox_terms(g, tokens, params)
    on = coverage(method, a, g)
    return {m.name: values for m, values in method_metrics(method, a, tokens, truth, params, on)}
