"""The token inspector's estimates: each method's estimate of log pi_prox for the tokens of one sequence, by
proxaudit's own estimator functions (`evaluator.formulas.estimators.estimates`, what replay computes), and
each one's signed error against the recomputed `prox_logp`. No formula here: only the columns they take."""

from __future__ import annotations

import numpy as np
import pandas as pd

from evaluator.formulas.estimators import estimates

ESTIMATE_COLUMNS = ["pos", "method", "estimate", "error"]


def per_token(tokens: pd.DataFrame, step: int) -> pd.DataFrame:
    """One row per (token, estimator) of a sequence's tokens at `step` (the inspector's frame, sorted by
    `pos`): pos, method, estimate and error = estimate - prox_logp (null where the token has no
    prox_logp, or the method no estimate; its absolute value is the store's `abs_error`). AReaL's shipped
    pairing takes the version of the previous `pos` in the same minibatch, -1 at the first."""
    if tokens.empty:
        return pd.DataFrame(columns=ESTIMATE_COLUMNS)
    tokens = tokens.sort_values(["minibatch", "pos"])
    column = {c: tokens[c].to_numpy(np.float64) for c in ("behave_logp", "theta_logp", "prox_logp")}
    proximal_t = tokens["proximal_t_logp"].to_numpy(np.float64)
    by_method = estimates(
        **column,
        step=np.full(len(tokens), float(step)),
        behave_version=tokens["behave_version"].to_numpy(np.float64),
        minibatch=tokens["minibatch"].to_numpy(np.float64),
        n_minibatches=tokens["n_minibatches"].to_numpy(np.float64),
        prev_version=tokens.groupby("minibatch")["behave_version"].shift(1).fillna(-1).to_numpy(np.float64),
        proximal_t_logp=proximal_t if not np.isnan(proximal_t).all() else None,
    )
    truth = by_method.pop("ground_truth")
    frame = pd.DataFrame(
        {
            "pos": np.tile(tokens["pos"].to_numpy(), len(by_method)),
            "method": np.repeat(list(by_method), len(tokens)),
            "estimate": np.concatenate(list(by_method.values())),
            "error": np.concatenate([v - truth for v in by_method.values()]),
        }
    )
    return frame.sort_values(["method", "pos"], kind="stable", ignore_index=True)
