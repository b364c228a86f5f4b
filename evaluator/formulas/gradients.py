"""Where an estimate `x` of log pi_prox reaches the gradient, for the loss the user runs
(`evaluator.formulas.loss`, DOMAIN.md 3c): its decisions and each token's gradient weight. Pure numpy.

Arrays are float64 `[n_tokens]` over a set of loss tokens: `t` = `theta_logp`, `b` = `behave_logp`, `x`;
`advantage` `[n_tokens]` or None (no advantage: |A| = 1 and two-sided clips; a NaN row likewise).
`Sequences` says which sequence each token belongs to (sequence-level losses need every loss token of a
sequence in the set). With `d = x - b`, `r = w(t - x)`, `w(z) = exp(min(z, 150))`:

    behaviour weight  omega = 1 | w(d) | w(sum_S d) | w(mean_S d)          then each rule: mask or clamp
    PPO, token        W = |A| omega r    (1 - C(r, A)) (1 - D(r, A)) keep   omega r = w(t - b) if not clamped
    PPO, sequence     W = |Abar| wbar s  (1 - C(s, Abar)) (1 - D(s, Abar)) keep,  s = w(mean_S' (t - x))
    CISPO             W = |A| omega clip(r, 1 - eps_low, 1 + eps_high) keep
    SAPO              W = |A| omega 4 r g (1 - g) keep,  g = sigmoid(tau (r - 1)), tau by the sign of A
                      (sequence level: s, Abar and wbar as for GSPO)
    C(r, A) = (A > 0 and r > 1 + eps_high) or (A < 0 and r < 1 - eps_low)     (no A: r outside the band)
    D(r, A) = A < 0 and r > dual_clip
    DPPO, IPO, GMPO, REINFORCE; M2PO and OPSM     `evaluator.formulas.policies`

`W` is the per-token gradient coefficient `|d loss / d theta_logp|` with the loss's normalisation by the
minibatch's token count taken out (S' = the sequence's kept tokens; means over them). An estimate that
flips no decision of a token-level loss with a token weight has exactly the true W: prox cancels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evaluator.formulas import F64, Flags, policies
from evaluator.formulas.loss import Loss, Rule
from evaluator.formulas.sequences import LOG_WEIGHT_MAX as LOG_WEIGHT_MAX  # re-exported
from evaluator.formulas.sequences import Sequences, weight

BINARY_KL_EPS = 1e-8


@dataclass(frozen=True)
class Decisions:
    """The loss's decisions and gradient weight for one `x` on a set of tokens (None: the loss has no
    such decision). Token flags are `[n_tokens]`; sequence flags `[n_sequences]`."""

    grad_weight: F64
    clip: Flags | None
    dual_clip: Flags | None
    bound: Flags | None
    """rejected by a mask rule, or its weight clamped by a clamp rule"""
    bound_lower: Flags | None
    """... by a lower bound"""
    sequence_clip: Flags | None
    sequence_bound: Flags | None


def statistic(rule: Rule, d: F64, x: F64, b: F64) -> F64:
    """The rule's statistic of each token (`evaluator.formulas.loss.STATISTICS`)."""
    if rule.statistic == "ratio":
        return weight(d)
    if rule.statistic == "kl_k1":
        return d
    if rule.statistic == "kl_k2":
        return d * d / 2
    if rule.statistic == "kl_k3":
        return weight(-d) - 1 + d
    if rule.statistic == "kl_k3_reverse":
        return weight(d) - 1 - d
    p, q = (np.clip(np.exp(v), BINARY_KL_EPS, 1 - BINARY_KL_EPS) for v in (x, b))
    kl = lambda u, v: u * np.log(u / v) + (1 - u) * np.log((1 - u) / (1 - v))  # noqa: E731
    return np.maximum(kl(p, q), kl(q, p))


def rule_values(rule: Rule, d: F64, x: F64, b: F64, seq: Sequences | None) -> F64:
    """The statistic a rule bounds, per token (token level) or per sequence broadcast to its tokens."""
    if rule.level == "token":
        return statistic(rule, d, x, b)
    agg = {"sum": seq.sum, "mean": lambda v: seq.mean(v)[0], "max": seq.max, "min": seq.min}[rule.agg]
    if rule.statistic == "ratio":  # aggregated in log space: sum is the product of the token ratios
        return weight(agg(d))[seq.code]
    return agg(statistic(rule, d, x, b))[seq.code]


@dataclass(frozen=True)
class Correction:
    """The behaviour weight after the rules: `omega` (None: no weight), which tokens are kept, which had
    their weight clamped, and which fell below a lower bound."""

    omega: F64 | None
    kept: Flags
    clamped: Flags
    below: Flags


def correct(
    x: F64, b: F64, seq: Sequences | None, loss: Loss, behave_weight: F64 | None = None
) -> Correction:
    """The behaviour weight of `loss` after its rules, in order (sequence statistics over every loss
    token). `behave_weight`: w(x - b) when already known."""
    d = x - b
    token_weight = weight(d) if behave_weight is None else behave_weight
    if loss.behave_weight == "none":
        omega = None
    elif loss.behave_weight == "token":
        omega = token_weight
    else:
        per_seq = seq.sum(d) if loss.behave_weight == "sequence_product" else seq.mean(d)[0]
        omega = weight(per_seq)[seq.code]
    kept = np.ones(len(x), dtype=bool)
    clamped, below = np.zeros(len(x), dtype=bool), np.zeros(len(x), dtype=bool)
    for rule in loss.rules:
        values = (
            token_weight
            if (rule.level, rule.statistic) == ("token", "ratio")
            else rule_values(rule, d, x, b, seq)
        )
        low = np.zeros(len(x), dtype=bool) if rule.lower is None else values < rule.lower
        inside = ~low if rule.upper is None else ~low & (values <= rule.upper)
        below |= low
        if rule.action == "mask":
            kept &= inside
        else:
            omega = np.where(inside, omega, np.clip(omega, rule.lower, rule.upper))
            clamped |= ~inside
    return Correction(omega, kept, clamped, below)


def clip_active(ratio: F64, advantage: F64 | None, loss: Loss) -> Flags:
    """C: PPO's clip turns the gradient off, for the ratio exp(theta - x): one-sided by the sign of A,
    two-sided where there is no advantage (None, or NaN on a row)."""
    above, below = ratio > 1 + loss.eps_high, ratio < 1 - loss.eps_low
    if advantage is None:
        return above | below
    one_sided = ((advantage > 0) & above) | ((advantage < 0) & below)
    return np.where(np.isnan(advantage), above | below, one_sided)


def _sequence_terms(
    t: F64, x: F64, advantage: F64 | None, omega: F64 | None, kept: Flags, seq: Sequences
) -> tuple[F64, F64 | None, F64, F64]:
    """Per token, from its sequence's kept tokens: the ratio s = w(mean (t - x)), the mean advantage
    (None without one; NaN where a sequence has none), |mean advantage| (1 where none), the mean weight."""
    log_s, _ = seq.mean(t - x, kept)
    s = weight(log_s)[seq.code]
    mean_advantage = None
    abs_mean = np.ones(len(t))
    if advantage is not None:
        known = kept & ~np.isnan(advantage)
        total = seq.sum(np.where(known, advantage, 0.0))
        count = seq.sum(known)
        per_seq = np.divide(total, count, out=np.full(seq.n, np.nan), where=count > 0)
        mean_advantage = per_seq[seq.code]
        abs_mean = np.where(np.isnan(mean_advantage), 1.0, np.abs(mean_advantage))
    wbar = np.ones(len(t)) if omega is None else seq.mean(omega, kept)[0][seq.code]
    return s, mean_advantage, abs_mean, wbar


def decide(
    x: F64, *, t: F64, b: F64, advantage: F64 | None, abs_advantage: F64 | float, off_policy_weight: F64,
    seq: Sequences | None, loss: Loss, behave_weight: F64 | None = None, ratio: F64 | None = None,
) -> Decisions:  # fmt: skip
    """The decisions and gradient weight of `loss` with `x` as log pi_prox (module docstring).
    `abs_advantage` (|A|, 1 where none) and `off_policy_weight` (w(t - b)) are the same for every x;
    `behave_weight` (w(x - b)) and `ratio` (w(t - x)) may be given when already known.

    A clip decision counts where the trainer counts it: under GSPO, CISPO and the losses of
    `evaluator.formulas.policies` only on the tokens the rules keep (AReaL cbff54d `functional.py`: GSPO's
    ratio and advantage are zeroed off the post-rejection mask, CISPO's `clip_mask` is taken on it; verl
    takes its clip fractions over its post-rejection `response_mask`); under token-level PPO on every token
    (AReaL's `clip_mask` there is on the pre-rejection mask); never on a token M2PO drops (AReaL passes the
    post-M2PO mask as the loss's mask)."""
    if loss.needs_sequences and seq is None:
        raise ValueError("this loss decides per sequence: give the tokens' Sequences")
    if loss.m2_threshold is not None:
        return _after_m2po(x, t=t, b=b, advantage=advantage, abs_advantage=abs_advantage,
                           off_policy_weight=off_policy_weight, seq=seq, loss=loss)  # fmt: skip
    return _decide(x, t=t, b=b, advantage=advantage, abs_advantage=abs_advantage,
                   off_policy_weight=off_policy_weight, seq=seq, loss=loss, behave_weight=behave_weight,
                   ratio=ratio)  # fmt: skip


def _decide(
    x: F64, *, t: F64, b: F64, advantage: F64 | None, abs_advantage: F64 | float, off_policy_weight: F64,
    seq: Sequences | None, loss: Loss, behave_weight: F64 | None = None, ratio: F64 | None = None,
) -> Decisions:  # fmt: skip
    """`decide` past M2PO's mask: the tokens are the ones it keeps (all of them without M2PO)."""
    fix = correct(x, b, seq, loss, behave_weight)
    kept, omega = fix.kept, fix.omega
    if loss.policy in ("ppo", "sapo", "cispo"):
        grad, clip, dual = _clipped(x, t, advantage, abs_advantage, off_policy_weight, seq, loss, fix, ratio)
    elif loss.policy == "gmpo":
        (grad, clip), dual = policies.gmpo(t, x, advantage, omega, kept, seq, loss), None
    elif loss.policy == "pg":
        grad, clip, dual = policies.reinforce(t, x, advantage, omega, kept, loss), None, None
    else:
        grad, clip, dual = policies.dppo(t, x, advantage, omega, kept, loss)
    if loss.ratio_level == "sequence" or loss.policy != "ppo":  # counted on the kept tokens only
        clip, dual = (None if f is None else f & kept for f in (clip, dual))
    if loss.opsm_delta is not None:  # slime multiplies the clipped loss by its mask: the clip still counts
        kept = kept & policies.opsm_kept(x, t, advantage, seq, loss.opsm_delta)
        grad = np.where(kept, grad, 0.0)
    bound = (~kept | fix.clamped) if loss.has_rules else None
    by_sequence = loss.has_sequence_clip
    return Decisions(
        grad_weight=grad,
        clip=clip,
        dual_clip=dual,
        bound=bound,
        bound_lower=fix.below if loss.has_lower_bound else None,
        sequence_clip=_per_sequence(clip, seq) if by_sequence else None,
        sequence_bound=_per_sequence(bound, seq) if loss.sequence_rules else None,
    )


def _clipped(
    x: F64, t: F64, advantage: F64 | None, abs_advantage: F64 | float, off_policy_weight: F64,
    seq: Sequences | None, loss: Loss, fix: Correction, ratio: F64 | None,
) -> tuple[F64, Flags | None, Flags | None]:  # fmt: skip
    """(W, clip, dual clip) of PPO, SAPO and CISPO, per token or per sequence (module docstring)."""
    kept, omega = fix.kept, fix.omega
    if loss.ratio_level == "sequence":
        ratio, signed, magnitude, mean_weight = _sequence_terms(t, x, advantage, omega, kept, seq)
        cancels = False
    else:
        ratio = weight(t - x) if ratio is None else ratio
        signed, magnitude, mean_weight = advantage, abs_advantage, 1.0 if omega is None else omega
        cancels = loss.behave_weight == "token"  # omega r = w(t - b) where neither is clamped: prox cancels
    if loss.policy == "sapo":
        positive = np.zeros(len(x), dtype=bool) if signed is None else signed > 0
        tau = np.where(positive, loss.sapo_tau_pos, loss.sapo_tau_neg)
        gate = 1 / (1 + np.exp(-tau * (ratio - 1)))
        return np.where(kept, magnitude * mean_weight * 4 * ratio * gate * (1 - gate), 0.0), None, None
    dual = None
    if loss.policy == "ppo":
        clip = clip_active(ratio, signed, loss)
        if loss.dual_clip is not None:
            negative = np.zeros(len(x), dtype=bool) if signed is None else signed < 0
            dual = negative & (ratio > loss.dual_clip)
        off, changed, size = clip if dual is None else clip | dual, fix.clamped, ratio
    else:  # cispo: the weight clip(r) is clamped outside the band, never zero
        clip = clip_active(ratio, None, loss)
        off, changed = np.zeros(len(x), dtype=bool), clip | fix.clamped
        size = np.clip(ratio, 1 - loss.eps_low, 1 + loss.eps_high)
    weighted = mean_weight * size
    if cancels:
        weighted = np.where(changed, weighted, off_policy_weight)
    return np.where(kept & ~off, magnitude * weighted, 0.0), clip, dual


def _after_m2po(
    x: F64, *, t: F64, b: F64, advantage: F64 | None, abs_advantage: F64 | float, off_policy_weight: F64,
    seq: Sequences, loss: Loss,
) -> Decisions:  # fmt: skip
    """The decisions of `loss` on the tokens M2PO keeps (AReaL applies M2PO first, then the loss with the
    narrowed mask); a dropped token has W 0, no clip, and counts as bound."""
    keep = policies.m2po_kept(x, b, seq.minibatch(), loss.m2_threshold)
    part = lambda v: v if v is None or np.ndim(v) == 0 else v[keep]  # noqa: E731
    inner = _decide(
        x[keep], t=t[keep], b=b[keep], advantage=part(advantage), abs_advantage=part(abs_advantage),
        off_policy_weight=off_policy_weight[keep], seq=seq.take(keep), loss=loss,
    )  # fmt: skip

    def whole(flags: F64 | Flags | None, fill: float | bool) -> F64 | Flags | None:
        if flags is None:
            return None
        out = np.full(len(x), fill, dtype=flags.dtype)
        out[keep] = flags
        return out

    return Decisions(
        grad_weight=whole(inner.grad_weight, 0.0),
        clip=whole(inner.clip, False),
        dual_clip=whole(inner.dual_clip, False),
        bound=~keep if inner.bound is None else whole(inner.bound, True),
        bound_lower=whole(inner.bound_lower, False),
        sequence_clip=inner.sequence_clip,
        sequence_bound=inner.sequence_bound,
    )


def _per_sequence(flags: Flags, seq: Sequences) -> Flags:
    """`[n_sequences]`: the flag of any of the sequence's tokens (a sequence-level decision is the same on
    all of them)."""
    return seq.sum(flags) > 0
