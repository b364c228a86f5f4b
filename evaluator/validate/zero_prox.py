"""The finding `prox_logp_zero` (a warning): `prox_logp` exactly 0 on nearly every token while the engine's
`behave_logp` is not, values no model gives. A trainer that skips the recompute pass can still write the
column: NeMo-RL with `loss_fn.force_on_policy_ratio` dumps `prev_logprobs = torch.zeros_like(...)`
(`grpo_train`), so an import of that dump holds prox = theta = 0. A log-prob of exactly 0 (probability 1
in float32) does occur on confident tokens, so the rule asks for 95% of 300+ tokens and behave at 0 on
under half of them.
"""

from __future__ import annotations

import polars as pl

from evaluator.problems import Finding
from evaluator.validate.evidence import RunEvidence
from evaluator.validate.verdicts import MIN_TOKENS, Verdict, too_few

ZERO_SHARE = 0.95
"""Share of tokens with `prox_logp` exactly 0 from which the column holds no recompute."""
BEHAVE_ZERO_SHARE = 0.5
"""... while `behave_logp` is exactly 0 on under this share (a model that really is that sure gives
behave 0 there too)."""


def prox_logp_zero(e: RunEvidence, _) -> Verdict:
    n = int(e.cells["n_prox"].sum())
    if undecided := too_few(n, "loss tokens with prox_logp", MIN_TOKENS):
        return undecided
    zero, behave_zero = int(e.cells["prox_is_zero"].sum()), int(e.cells["behave_is_zero"].sum())
    if zero < ZERO_SHARE * n or behave_zero >= BEHAVE_ZERO_SHARE * n:
        return None
    return Finding(
        "prox_logp_zero", e.run_id, "prox_logp", zero,
        f"prox_logp is exactly 0 on {zero:,} of {n:,} tokens, behave_logp on {behave_zero:,}: no model "
        "gives probability 1 to nearly every token, so the column holds no recompute (NeMo-RL writes "
        "prev_logprobs as zeros under loss_fn.force_on_policy_ratio); these tokens measure nothing against "
        "the ground truth",
        zero / n, f">= {ZERO_SHARE:.0%} of the tokens, behave 0 on < {BEHAVE_ZERO_SHARE:.0%}",
        e.cell_examples(pl.col("prox_is_zero") > 0),
        "that the trainer ran its recompute pass",
    )  # fmt: skip
