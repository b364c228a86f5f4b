"""verl's rollout-correction diagnostics (`schemas.store.VERL_DIAGNOSTICS`) and the trainers' own mismatch
series, computed from the terms of one estimate `e` (`evaluator.formulas.terms.ProxTerms`): verl 1dda039
`verl/trainer/ppo/rollout_corr_helper.py` (compute_is_metrics, compute_rs_metrics,
compute_offpolicy_metrics) and `verl/utils/debug/metrics.py` (calculate_debug_metrics), with
`d = clamp(a - b, -20, 20)` verl's safety-bounded log ratio and `T` its rollout_is_threshold default.
Terms several series share are computed once per estimate (`ProxTerms.memo`). Pure numpy."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from evaluator.formulas import F64, Flags
from evaluator.formulas.policies import VERL_LOG_BOUND
from evaluator.formulas.sequences import weight
from evaluator.formulas.terms import ProxTerms
from schemas.store import VERL_SEQUENCE_K, VERL_T


def _flag(x: Flags) -> F64:
    return x.astype(np.float64)


def _memo(e: ProxTerms, key: str, compute: Callable[[], F64]) -> F64:
    """The term `key` of `e`, computed once."""
    if key not in e.memo:
        e.memo[key] = compute()
    return e.memo[key]


def _d(e: ProxTerms) -> F64:
    """verl's safety-bounded log ratio d = clamp(a - b, -20, 20)."""
    return _memo(e, "d", lambda: np.clip(e.x - e.tokens.b, -VERL_LOG_BOUND, VERL_LOG_BOUND))


def _exp_d(e: ProxTerms) -> F64:
    """verl's token importance weight exp(d)."""
    return _memo(e, "exp d", lambda: np.exp(_d(e)))


def _k(name: str, e: ProxTerms) -> F64:
    """verl's per-token k1 (b - a), k2 (d^2 / 2) and k3 (exp(d) - 1 - d)."""
    d = _d(e)
    terms = {"k1": lambda: -d, "k2": lambda: d * d / 2, "k3": lambda: _exp_d(e) - 1 - d}
    return _memo(e, name, terms[name])


def _truncated(e: ProxTerms) -> F64:
    """verl's applied token weight min(exp(d), T) (TIS at the default threshold)."""
    return _memo(e, "truncated", lambda: np.minimum(_exp_d(e), VERL_T))


SEQUENCE_TERMS: dict[str, Callable[[ProxTerms], F64]] = {
    "log_ratio": lambda e: e.x - e.tokens.b,
    "log_ppl_diff": lambda e: e.tokens.b - e.x,
    "neg_a": lambda e: -e.x,
    "neg_b": lambda e: -e.tokens.b,
    "abs_diff": lambda e: np.abs(e.x - e.tokens.b),
    "weight": _exp_d,
    "truncated": _truncated,
    "token_outside": lambda e: _flag(np.abs(_d(e)) > np.log(VERL_T)),
    **{k: partial(_k, k) for k in ("k1", "k2", "k3")},
}
"""The token series that per-sequence metrics sum, average or take the maximum of."""


def _sequence_weight_truncated(e: ProxTerms) -> F64:
    """`[n_sequences]` verl's applied sequence weight min(exp(clamp(sum_S (a - b), -20, 20)), T)."""
    bounded = np.clip(_per_sequence(e, "log_ratio"), -VERL_LOG_BOUND, VERL_LOG_BOUND)
    return _memo(e, "sequence truncated", lambda: np.minimum(np.exp(bounded), VERL_T))


def _per_sequence(e: ProxTerms, term: str, agg: str = "sum") -> F64:
    """`[n_sequences]` sums, means or maxima of the token series `SEQUENCE_TERMS[term]` over each sequence's
    tokens (a sequence with none: mean 0); a term's sums are computed once for its sum and mean."""
    seq = e.tokens.sequences
    if agg == "max":
        return seq.max(SEQUENCE_TERMS[term](e))
    total = _memo(e, f"sum {term}", lambda: seq.sum(SEQUENCE_TERMS[term](e)))
    return total if agg == "sum" else total / np.maximum(seq.counts, 1.0)


DIAGNOSTICS: dict[str, Callable] = {
    "is_weight": lambda e, g: _exp_d(e),
    "is_weight_truncated": lambda e, g: _truncated(e),
    "is_seq_weight_truncated": lambda e, g: _sequence_weight_truncated(e)[e.tokens.sequences.code],
    "prob_diff": lambda e, g: np.abs(np.exp(e.x) - np.exp(e.tokens.b)),
    "is_weight_high": lambda e, g: _flag(_exp_d(e) > VERL_T),
    "is_weight_low": lambda e, g: _flag(_exp_d(e) < 1 / VERL_T),
    "approx_prob": lambda e, g: np.exp(e.x),
    "behave_prob": lambda e, g: np.exp(e.tokens.b),
    "prob_product": lambda e, g: np.exp(e.x) * np.exp(e.tokens.b),
    "seq_is_weight": lambda e, g: np.exp(np.clip(_per_sequence(e, "log_ratio"), -20, 20)),
    "seq_geo_weight": lambda e, g: weight(_per_sequence(e, "log_ratio", "mean")),
    "seq_is_weight_low": lambda e, g: _flag(_per_sequence(e, "log_ratio") < -np.log(VERL_T)),
    "seq_is_weight_high": lambda e, g: _flag(_per_sequence(e, "log_ratio") > np.log(VERL_T)),
    "seq_log_ratio": lambda e, g: _per_sequence(e, "log_ratio"),
    "seq_is_weight_truncated": lambda e, g: _sequence_weight_truncated(e),
    "seq_token_weight_mean": lambda e, g: _per_sequence(e, "truncated", "mean"),
    "seq_token_weight_high": lambda e, g: _flag(_per_sequence(e, "weight", "mean") > VERL_T),
    "seq_token_weight_low": lambda e, g: _flag(_per_sequence(e, "weight", "mean") < 1 / VERL_T),
    "seq_log_ppl": lambda e, g: _per_sequence(e, "neg_a", "mean"),
    "seq_ppl": lambda e, g: weight(_per_sequence(e, "neg_a", "mean")),
    "seq_behave_log_ppl": lambda e, g: _per_sequence(e, "neg_b", "mean"),
    "seq_behave_ppl": lambda e, g: weight(_per_sequence(e, "neg_b", "mean")),
    "seq_drift": lambda e, g: _per_sequence(e, "abs_diff", "mean"),
    "seq_token_outside": lambda e, g: _flag(_per_sequence(e, "token_outside") > 0),
    "seq_log_ppl_diff": lambda e, g: _per_sequence(e, "log_ppl_diff", "mean"),
    "seq_log_ppl_abs_diff": lambda e, g: np.abs(_per_sequence(e, "log_ppl_diff", "mean")),
    "seq_ppl_ratio": lambda e, g: weight(_per_sequence(e, "log_ppl_diff", "mean")),
    **{f"seq_{k}_{agg}": lambda e, g, k=k, agg=agg: _per_sequence(e, k, agg) for k, agg in VERL_SEQUENCE_K},
}
