"""Estimators of log pi_prox (DOMAIN.md section 2): pure numpy functions, no I/O.

Roles: `behave` = log pi_behave (`behave_logp`), `theta` = log pi_theta (`theta_logp`), both packed
`[n_tokens]` arrays of log-probs (<= 0), cast to float64 on entry. Versions are `[n_tokens]` integer or
float arrays (or scalars that broadcast).

    alpha = (v_prox - v_behave) / (v_theta - v_behave), clamped to [0, 1]; 0 where v_theta <= v_behave

Version conventions: `areal` (v_prox = step - 1, v_theta = step; what AReaL ships) and `exact`
(v_prox = step, v_theta = step + minibatch / n_minibatches). Version pairing: each token's own version
(`loglinear`, `linear`), or AReaL's shipped pairing (`*_shipped`): the version of the previous token of
the sequence, -1 (alpha 0) at pos 0, because AReaL rolls log-probs for next-token prediction but not
versions.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from evaluator.formulas import F64, check_shapes


def alpha(v_prox: ArrayLike, v_behave: ArrayLike, v_theta: ArrayLike) -> F64:
    """alpha = clip((v_prox - v_behave) / (v_theta - v_behave), 0, 1); 0 where v_theta <= v_behave.

    `v_theta == v_behave` (theta is the behaviour policy) gives 0, so every estimate falls back to behave.
    """
    v_prox, v_behave, v_theta = (np.asarray(v, dtype=np.float64) for v in (v_prox, v_behave, v_theta))
    check_shapes(v_prox=v_prox, v_behave=v_behave, v_theta=v_theta)
    span = v_theta - v_behave
    ahead = span > 0
    ratio = np.divide(v_prox - v_behave, span, out=np.zeros(np.broadcast(v_prox, span).shape), where=ahead)
    return np.clip(ratio, 0.0, 1.0)


def areal_versions(step: ArrayLike) -> tuple[F64, F64]:
    """The `areal` convention: (v_prox, v_theta) = (step - 1, step)."""
    step = np.asarray(step, dtype=np.float64)
    return step - 1.0, step


def exact_versions(step: ArrayLike, minibatch: ArrayLike, n_minibatches: ArrayLike) -> tuple[F64, F64]:
    """The `exact` convention: (v_prox, v_theta) = (step, step + minibatch / n_minibatches)."""
    step = np.asarray(step, dtype=np.float64)
    return step, step + np.asarray(minibatch, dtype=np.float64) / np.asarray(n_minibatches, dtype=np.float64)


def shipped_alpha(step: ArrayLike, prev_version: ArrayLike) -> F64:
    """alpha_shipped = alpha(step - 1, v_prev, step) where v_prev >= 0, else 0: the `areal` alpha with
    AReaL's shipped pairing, v_prev = the version of the token at `pos - 1` of the same sequence.

    At pos 0, v_prev is the prompt's -1, for which AReaL sets alpha 0 (the estimate is behave); the first
    token of a resumed segment takes the previous segment's version.
    """
    v_prev = np.asarray(prev_version, dtype=np.float64)
    v_prox, v_theta = areal_versions(step)
    return np.where(v_prev >= 0, alpha(v_prox, v_prev, v_theta), 0.0)


def loglinear(behave: ArrayLike, theta: ArrayLike, alpha: ArrayLike) -> F64:
    """loglinear = behave + alpha * (theta - behave): interpolation in log space.

    Exactly `behave` at alpha 0 and exactly `theta` at alpha 1 (no rounding).
    """
    behave, theta, alpha = (np.asarray(x, dtype=np.float64) for x in (behave, theta, alpha))
    check_shapes(behave=behave, theta=theta, alpha=alpha)
    return np.where(alpha == 1.0, theta, behave + alpha * (theta - behave))


def linear(behave: ArrayLike, theta: ArrayLike, alpha: ArrayLike) -> F64:
    """linear = log((1 - alpha) * exp(behave) + alpha * exp(theta)): interpolation in probability space.

    Computed as logaddexp(log1p(-alpha) + behave, log(alpha) + theta), which never forms exp(behave), so it
    stays finite for log-probs down to -1000 and beyond; log(0) = -inf makes it exact at alpha 0 and 1.
    (AReaL adds 1e-10 inside the log and floors at about -23.03; this form differs only below about -20.)
    """
    behave, theta, alpha = (np.asarray(x, dtype=np.float64) for x in (behave, theta, alpha))
    check_shapes(behave=behave, theta=theta, alpha=alpha)
    with np.errstate(divide="ignore"):
        return np.logaddexp(np.log1p(-alpha) + behave, np.log(alpha) + theta)


def rollout(behave: ArrayLike) -> F64:
    """rollout = behave: no correction at all (the baseline every estimator must beat)."""
    return np.asarray(behave, dtype=np.float64)


def reuse_train_logp(theta: ArrayLike) -> F64:
    """reuse_train_logp = theta: the training forward's log-prob as prox (AReaL's
    `prox_logp_method: reuse_train_logp`, which forces one minibatch). Exact at minibatch 0 up to how far the
    training forward is from the recompute forward (batch shapes, kernels, train-mode numerics)."""
    return np.asarray(theta, dtype=np.float64)


def proximal_t(proximal_t_logp: ArrayLike) -> F64:
    """proximal_t = proximal_t_logp, the segment-wise log-prob under behave_version + 1 (section 4);
    NaN (null in the log) where the log does not have it."""
    return np.asarray(proximal_t_logp, dtype=np.float64)


def ground_truth(prox_logp: ArrayLike) -> F64:
    """ground_truth = prox_logp, the recomputed log pi_prox; NaN where it was not recomputed."""
    return np.asarray(prox_logp, dtype=np.float64)


def estimates(
    *,
    behave_logp: ArrayLike,
    theta_logp: ArrayLike,
    prox_logp: ArrayLike,
    step: ArrayLike,
    behave_version: ArrayLike,
    minibatch: ArrayLike,
    n_minibatches: ArrayLike,
    prev_version: ArrayLike,
    proximal_t_logp: ArrayLike | None = None,
) -> dict[str, F64]:
    """Every method's estimate of log pi_prox for packed `[n_tokens]` columns, keyed by method name
    (`schemas.store.METHODS` order). `prev_version` is the version of each token's previous `pos` in its
    sequence (-1 at pos 0), for the shipped pairing. NaN marks tokens where a method has no estimate."""
    behave, theta = np.asarray(behave_logp, np.float64), np.asarray(theta_logp, np.float64)
    v_prox, v_theta = areal_versions(step)
    alpha_areal = alpha(v_prox, behave_version, v_theta)
    alpha_shipped = shipped_alpha(step, prev_version)
    v_prox, v_theta = exact_versions(step, minibatch, n_minibatches)
    alpha_exact = alpha(v_prox, behave_version, v_theta)
    out = {
        "ground_truth": ground_truth(prox_logp),
        "loglinear": loglinear(behave, theta, alpha_areal),
        "linear": linear(behave, theta, alpha_areal),
        "loglinear_shipped": loglinear(behave, theta, alpha_shipped),
        "linear_shipped": linear(behave, theta, alpha_shipped),
        "loglinear_exact": loglinear(behave, theta, alpha_exact),
        "linear_exact": linear(behave, theta, alpha_exact),
        "rollout": rollout(behave),
        "reuse_train_logp": reuse_train_logp(theta),
    }
    if proximal_t_logp is not None:
        out["proximal_t"] = proximal_t(proximal_t_logp)
    return out
