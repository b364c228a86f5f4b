"""The terms of one estimate of log pi_prox on a set of loss tokens, which the metrics
(`evaluator.formulas.metrics`) and the trainers' diagnostics (`evaluator.formulas.diagnostics`) are computed
from: the tokens' columns (`Tokens`), and per estimate `x` the behaviour weight w(x - b), the ratio
w(t - x) and the loss's decisions (`ProxTerms`). Pure numpy."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from evaluator.formulas import F64, Flags, check_shapes
from evaluator.formulas.gradients import Decisions, Sequences, decide, weight
from evaluator.formulas.loss import Loss


@dataclass(frozen=True)
class Tokens:
    """The log's columns on one set of loss tokens, float64 `[n]`: `b` = `behave_logp`, `t` =
    `theta_logp`, `g` = `prox_logp` (NaN where not recomputed), `advantage` (None: the log has none), and
    each token's sequence (None when no metric or decision needs it)."""

    b: F64
    t: F64
    g: F64
    advantage: F64 | None = None
    sequences: Sequences | None = None
    off_policy_weight: F64 = field(init=False)  # w(t - b): the same for every estimate
    abs_advantage: F64 | float = field(init=False)  # |A|, 1 where there is none

    def __post_init__(self) -> None:
        code = None if self.sequences is None else self.sequences.code
        check_shapes(b=self.b, t=self.t, g=self.g, advantage=self.advantage, sequences=code)
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
        object.__setattr__(out, "sequences", None if self.sequences is None else self.sequences.take(mask))
        return out


@dataclass(frozen=True)
class ProxTerms:
    """What follows from one log pi_prox `x` (an estimate, or the truth `g`) on a set of tokens: the
    behaviour weight w(x - b), the ratio w(t - x), and the loss's decisions and gradient weights."""

    x: F64
    tokens: Tokens
    behave_weight: F64
    ratio: F64
    decisions: Decisions
    memo: dict[str, F64] = field(default_factory=dict, init=False, repr=False, compare=False)
    """terms that several metrics share, computed once (`_memo`)"""

    def take(self, mask: Flags | None) -> ProxTerms:
        """These terms where `mask` is true (all of them for None); per-sequence decisions stay whole."""
        if mask is None:
            return self
        d = self.decisions
        token_flags = {
            name: None if getattr(d, name) is None else getattr(d, name)[mask]
            for name in ("grad_weight", "clip", "dual_clip", "bound", "bound_lower")
        }
        arrays = (self.x, self.behave_weight, self.ratio)
        return ProxTerms(
            arrays[0][mask],
            self.tokens.take(mask),
            arrays[1][mask],
            arrays[2][mask],
            replace(d, **token_flags),
        )


def prox_terms(
    x: F64, tokens: Tokens, loss: Loss, *, behave_weight: F64 | None = None, ratio: F64 | None = None,
) -> ProxTerms:  # fmt: skip
    """The terms of `x` on `tokens` under `loss`; `behave_weight` and `ratio` may be given when already
    known (for x = b they are 1 and the tokens' off-policy weight)."""
    behave_weight = weight(x - tokens.b) if behave_weight is None else behave_weight
    ratio = weight(tokens.t - x) if ratio is None else ratio
    decisions = decide(
        x, t=tokens.t, b=tokens.b, advantage=tokens.advantage, abs_advantage=tokens.abs_advantage,
        off_policy_weight=tokens.off_policy_weight, seq=tokens.sequences, loss=loss,
        behave_weight=behave_weight, ratio=ratio,
    )  # fmt: skip
    return ProxTerms(x, tokens, behave_weight, ratio, decisions)
