"""The metrics of DOMAIN.md sections 3, 3b and 3c, computed by name: pure numpy.

`schemas.store.METRIC_TABLE` defines every metric (its formula, whether it needs the ground truth, which
methods and losses have it, per token or per sequence); `VALUES` here computes each from the terms of one
estimate and of the truth under the loss (`evaluator.formulas.gradients`).

The token sets (one mask model): a batch's loss tokens; of them, a method's **estimated** tokens (where its
estimate of log pi_prox exists, not NaN) and its **judged** tokens (estimated, and `prox_logp` known). A
metric that needs the truth is counted on the judged tokens, the others on the estimated ones. Under a loss
that decides per sequence, a token counts only where its whole sequence does; a per-sequence metric counts
the sequences whose every loss token is in the set. `coverage` gives a method's sets, `method_metrics` every
metric of it on its set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, NamedTuple, TypeVar

import numpy as np

from evaluator.formulas import F64, Flags, check_shapes
from evaluator.formulas.diagnostics import DIAGNOSTICS
from evaluator.formulas.gradients import Sequences, weight
from evaluator.formulas.loss import DEFAULT_LOSS, Loss
from evaluator.formulas.terms import ProxTerms, Tokens, prox_terms
from schemas.store import METRIC_TABLE, Metric, metrics_for

EPS = 1e-8
T = TypeVar("T")


def _flag(x: Flags) -> F64:
    return x.astype(np.float64)


def _flip(name: str) -> Callable[[ProxTerms, ProxTerms], F64]:
    return lambda e, g: _flag(getattr(e.decisions, name) != getattr(g.decisions, name))


# Each metric of METRIC_TABLE from the estimate's terms `e` and the truth's `g` on the same tokens (`g` is
# None for a metric that does not need the truth). A per-sequence metric gives `[n_sequences]` values.
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
    "clip_active": lambda e, g: _flag(e.decisions.clip),
    "clip_flip": _flip("clip"),
    "dual_clip_active": lambda e, g: _flag(e.decisions.dual_clip),
    "dual_clip_flip": _flip("dual_clip"),
    "bound_active": lambda e, g: _flag(e.decisions.bound),
    "bound_flip": _flip("bound"),
    "bound_lower_flip": _flip("bound_lower"),
    "grad_weight": lambda e, g: e.decisions.grad_weight,
    "grad_weight_abs_error": lambda e, g: np.abs(e.decisions.grad_weight - g.decisions.grad_weight),
    "true_grad_weight": lambda e, g: g.decisions.grad_weight,
    "drift": lambda e, g: np.abs(g.x - g.tokens.b),
    "prob_drift": lambda e, g: np.abs(np.exp(g.x) - np.exp(g.tokens.b)),
    "exp_abs_drift": lambda e, g: weight(np.abs(g.x - g.tokens.b)),
    "sequence_clip_active": lambda e, g: _flag(e.decisions.sequence_clip),
    "sequence_clip_flip": _flip("sequence_clip"),
    "sequence_bound_active": lambda e, g: _flag(e.decisions.sequence_bound),
    "sequence_bound_flip": _flip("sequence_bound"),
}


VALUES |= DIAGNOSTICS
assert set(VALUES) == {m.name for m in METRIC_TABLE}, "every metric of the table has one formula here"


class Coverage(NamedTuple, Generic[T]):
    """A method's token sets and sequence sets, as masks of a batch's tokens (None: every token) and of
    its sequences, or anything kept per set (their groups)."""

    estimated: T
    """where its estimate of log pi_prox exists: metrics that do not need the truth are counted here"""
    judged: T
    """estimated, and `prox_logp` known: metrics that need the truth are counted here"""
    estimated_sequences: T
    """the sequences whose every loss token is estimated (per-sequence metrics without the truth)"""
    judged_sequences: T
    """... is judged (per-sequence metrics that need the truth)"""

    def of(self, metric: Metric) -> T:
        """The set `metric` is counted on."""
        if metric.per == "sequence":
            return self.judged_sequences if metric.needs_truth else self.estimated_sequences
        return self.judged if metric.needs_truth else self.estimated


def _whole(mask: Flags, sequences: Sequences | None) -> tuple[Flags, Flags | None]:
    """(the tokens of `mask` whose sequence is wholly in it, `[n_sequences]` those sequences with a token);
    `mask` itself when there are no sequences."""
    if sequences is None:
        return mask, None
    present = sequences.counts > 0
    whole = (sequences.sum(~mask) == 0) & present
    return mask & whole[sequences.code], whole


def coverage(method: str, estimate: F64, tokens: Tokens, loss: Loss) -> Coverage[Flags | None]:
    """The token and sequence sets of `method` (NaN marks a missing estimate or truth); under a loss that
    decides per sequence a token counts only with its whole sequence."""
    has_truth = ~np.isnan(tokens.g)
    estimated = has_truth if method == "ground_truth" else ~np.isnan(estimate)
    judged = estimated & has_truth
    whole_estimated, estimated_sequences = _whole(estimated, tokens.sequences)
    whole_judged, judged_sequences = _whole(judged, tokens.sequences)
    if loss.needs_sequences:
        estimated, judged = whole_estimated, whole_judged
    tokens_sets = (None if mask.all() else mask for mask in (estimated, judged))
    return Coverage(*tokens_sets, estimated_sequences, judged_sequences)


def method_metrics(
    method: str, estimate: F64, tokens: Tokens, truth: ProxTerms, loss: Loss, on: Coverage[Flags | None]
) -> Iterator[tuple[Metric, F64]]:
    """Every metric of `method` under `loss` (`schemas.store.metrics_for`) on `tokens`, each on its set of
    `on` (`coverage`). `truth`: the terms of `prox_logp` on every token of `tokens`."""
    if method == "ground_truth":  # the truth's own terms, computed once
        est = truth.take(on.estimated)
    elif method in ("rollout", "reuse_train_logp") and on.estimated is None:  # x = b or x = t: known weights
        ones, off_policy = np.ones_like(estimate), tokens.off_policy_weight
        known = (ones, off_policy) if method == "rollout" else (off_policy, ones)
        est = prox_terms(estimate, tokens, loss, behave_weight=known[0], ratio=known[1])
    else:
        x = estimate if on.estimated is None else estimate[on.estimated]
        est = prox_terms(x, tokens.take(on.estimated), loss)
    judged_of_estimated = None
    if on.judged is not None:
        judged_of_estimated = on.judged if on.estimated is None else on.judged[on.estimated]
    est_judged, truth_judged = est.take(judged_of_estimated), truth.take(on.judged)
    for metric in metrics_for(method, loss):
        if (metric.per == "sequence" or metric.by_sequence) and tokens.sequences is None:
            continue  # no sequences given: the metrics of single tokens only
        if metric.needs_truth:
            values = VALUES[metric.name](est_judged, truth_judged)
        else:
            values = VALUES[metric.name](est, None)
        yield metric, values if metric.per == "token" else values[on.of(metric)]


def metric_values(
    method: str,
    *,
    a: F64,
    b: F64,
    t: F64,
    g: F64,
    advantage: F64 | None = None,
    sequences: Sequences | None = None,
    loss: Loss = DEFAULT_LOSS,
) -> dict[str, F64]:
    """Every metric of `method` on the given tokens: those that need the truth where `g` is known, the
    others where the estimate `a` exists (per sequence: the sequences wholly there)."""
    check_shapes(a=a, b=b)
    tokens = Tokens(b=b, t=t, g=g, advantage=advantage, sequences=sequences)
    truth = prox_terms(g, tokens, loss)
    on = coverage(method, a, tokens, loss)
    return {m.name: values for m, values in method_metrics(method, a, tokens, truth, loss, on)}
