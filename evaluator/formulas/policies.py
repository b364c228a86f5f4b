"""The policy losses beyond PPO, SAPO and CISPO (`evaluator.formulas.loss.POLICIES`), and the screens that
remove tokens by the estimate (M2PO, OPSM): each token's gradient weight and decisions, pure numpy, for
`evaluator.formulas.gradients.decide`.

Arrays are float64 `[n_tokens]`: `t` = `theta_logp`, `x` the log pi_prox used, `b` = `behave_logp`; `kept`
the tokens the rules keep, `omega` their behaviour weight after the rules (None: no weight); `advantage`
signed, None or NaN on a row without one (then A = 1: sign +, the masks two-sided). `k` = `kl_penalty`.

    DPPO-TV  valid = exp(t) - exp(x) <= eps_high if A > 0 else >= -eps_low            (verl dppo_tv)
    DPPO-KL  valid = bkl <= eps_high or exp(t) <= exp(x) if A > 0 else bkl <= eps_low or exp(t) >= exp(x)
             bkl = p (x - t) + (1 - p) log((1 - p + 1e-8) / (1 - q + 1e-8)), p = exp(x), q = exp(t)
    IPO      valid = |exp(t) - exp(x)| <= eps_high                                      (prime-rl ipo)
             W = omega |A rho valid - 2 k (t - x)|  kept
             rho = min(exp(clamp(t - x, -20, 20)), c) with verl's truncation c, else w(t - x) (prime-rl)
    GMPO     W = |Abar| S wgeo active / (L + 1e-8), over a sequence's L kept tokens:        (verl geo_mean)
             m = t - x clipped at eps_high for A > 0, at -eps_low for A < 0 (log space), 0 for A = 0;
             S = exp(sum m / (L + 1e-8)), Abar = sum A / (L + 1e-8),
             wgeo = exp(sum log(omega + 1e-10) / (L + 1e-8)), active = A != 0 and m not clipped
             (the loss's mean over sequences taken out: W is d loss / d theta times their number)
    pg       W = omega |A - 2 k (t - x)|  kept                                              (verl dro)
    M2PO     per minibatch: drop the tokens of largest (b - x)^2 until the mean of the rest is below the
             threshold (all but one when no suffix is)                (AReaL _apply_m2po_masking)
    OPSM     drop a token where A < 0 and the mean of (x - t) over its sequence's loss tokens > delta
                                                                      (slime compute_opsm_mask)
"""

from __future__ import annotations

import numpy as np

from evaluator.formulas import F64, Flags
from evaluator.formulas.loss import Loss
from evaluator.formulas.sequences import Sequences, weight

VERL_LOG_BOUND = 20.0
"""verl clamps a log-ratio to [-20, 20] before exp (`core_algos.py`, `rollout_corr_helper.py`)."""
DPPO_KL_EPS = 1e-8
"""verl's dppo_kl adds 1e-8 inside its Bernoulli log."""
GMPO_LENGTH_EPS = 1e-8
GMPO_WEIGHT_EPS = 1e-10
"""verl's geo_mean divides by L + 1e-8 and takes log(weight + 1e-10)."""


def _sign(advantage: F64 | None, n: int) -> F64:
    """A where the row has one, 1 elsewhere."""
    if advantage is None:
        return np.ones(n)
    return np.where(np.isnan(advantage), 1.0, advantage)


def dppo_valid(t: F64, x: F64, advantage: F64 | None, loss: Loss) -> Flags:
    """DPPO's and IPO's trust region: the tokens whose probability change keeps them in the loss."""
    q, p = np.exp(t), np.exp(x)
    if loss.policy == "ipo":
        return np.abs(q - p) <= loss.eps_high
    if loss.policy == "dppo_tv":
        up, down = q - p <= loss.eps_high, q - p >= -loss.eps_low
    else:
        with np.errstate(invalid="ignore"):  # q > 1 (an estimate above log 1): NaN, as torch.log gives verl
            bkl = p * (x - t) + (1 - p) * np.log((1 - p + DPPO_KL_EPS) / (1 - q + DPPO_KL_EPS))
        up, down = (bkl <= loss.eps_high) | (q <= p), (bkl <= loss.eps_low) | (q >= p)
    if advantage is None:
        return up & down
    return np.where(np.isnan(advantage), up & down, np.where(advantage > 0, up, down))


def dppo(
    t: F64, x: F64, advantage: F64 | None, omega: F64 | None, kept: Flags, loss: Loss
) -> tuple[F64, Flags, Flags | None]:
    """(W, the mask's decision `not valid`, the truncation `rho > c` of valid tokens or None)."""
    valid = dppo_valid(t, x, advantage, loss)
    truncated = None
    if loss.dual_clip is None:
        rho = weight(t - x)
    else:
        raw = np.exp(np.clip(t - x, -VERL_LOG_BOUND, VERL_LOG_BOUND))
        rho, truncated = np.minimum(raw, loss.dual_clip), (raw > loss.dual_clip) & valid
    grad = np.abs(_sign(advantage, len(t)) * rho * valid - 2 * loss.kl_penalty * (t - x))
    grad = grad if omega is None else omega * grad
    return np.where(kept, grad, 0.0), ~valid, truncated


def reinforce(t: F64, x: F64, advantage: F64 | None, omega: F64 | None, kept: Flags, loss: Loss) -> F64:
    """W of `pg`: REINFORCE on log pi_theta with the penalty (verl's DRO)."""
    grad = np.abs(_sign(advantage, len(t)) - 2 * loss.kl_penalty * (t - x))
    return np.where(kept, grad if omega is None else omega * grad, 0.0)


def gmpo(
    t: F64, x: F64, advantage: F64 | None, omega: F64 | None, kept: Flags, seq: Sequences, loss: Loss
) -> tuple[F64, Flags]:
    """(W of verl's geo_mean, each token's clip: its log-ratio past the band on its advantage's side)."""
    a = _sign(advantage, len(t))
    two_sided = np.zeros(len(t), dtype=bool) if advantage is None else np.isnan(advantage)
    log_ratio = t - x
    above, below = log_ratio > loss.eps_high, log_ratio < -loss.eps_low
    clip = ((a > 0) & above) | ((a < 0) & below) | (two_sided & (above | below))
    m = np.where(a > 0, np.minimum(log_ratio, loss.eps_high), np.maximum(log_ratio, -loss.eps_low))
    m = np.where(two_sided, np.clip(log_ratio, -loss.eps_low, loss.eps_high), np.where(a == 0, 0.0, m))
    length = seq.sum(kept) + GMPO_LENGTH_EPS  # (S,)
    per_seq = np.exp(seq.sum(np.where(kept, m, 0.0)) / length) * np.abs(
        seq.sum(np.where(kept, a, 0.0)) / length
    )
    if omega is not None:
        per_seq = per_seq * np.exp(seq.sum(np.where(kept, np.log(omega + GMPO_WEIGHT_EPS), 0.0)) / length)
    active = kept & ~clip & (a != 0)
    return np.where(active, (per_seq / length)[seq.code], 0.0), clip


def m2po_kept(x: F64, b: F64, group: np.ndarray, threshold: float) -> Flags:
    """AReaL's M2PO within each group (minibatch) of tokens: False on the tokens of largest (b - x)^2 that
    it drops. A token without `x` (NaN) is in no group and dropped."""
    m2 = np.square(b - x)
    known = np.flatnonzero(~np.isnan(m2))
    order = known[np.lexsort((-m2[known], group[known]))]  # by group, then (b - x)^2 descending
    g, v = group[order], m2[order]
    new = np.ones(len(g), dtype=bool)
    new[1:] = g[1:] != g[:-1]
    run = np.cumsum(new) - 1  # (K,) each sorted token's group, 0..G-1
    start = np.flatnonzero(new)  # (G,)
    count = np.diff(np.append(start, len(g)))
    rank = np.arange(len(g)) - start[run]
    before = np.cumsum(v) - v  # the sum of the values sorted before each
    suffix = (before[start] + np.add.reduceat(v, start))[run] - before if len(g) else v
    below = suffix / (count[run] - rank) < threshold
    first = np.minimum.reduceat(np.where(below, rank, count[run] - 1), start) if len(g) else count
    keep = np.zeros(len(x), dtype=bool)
    keep[order] = rank >= first[run]
    return keep


def opsm_kept(x: F64, t: F64, advantage: F64 | None, seq: Sequences, delta: float) -> Flags:
    """slime's OPSM: False on the tokens with A < 0 of a sequence whose mean x - t exceeds delta."""
    if advantage is None:
        return np.ones(len(x), dtype=bool)
    drift = seq.mean(x - t)[0][seq.code]
    return ~((advantage < 0) & (drift > delta))
