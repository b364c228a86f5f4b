"""The finding `no_ground_truth` (a warning): no loss token of a run has `prox_logp` in the files of the call,
so nothing judges the estimators: every error, decision figure and safe staleness needs the recompute's
log-prob. The usual production run skips the recompute pass (AReaL's `prox_logp_method: loglinear`).

Its sentence is also what `summary` and the gate say of a stored run without ground truth
(`no_truth_message`), with the recipe of `docs/hook.md`.
"""

from __future__ import annotations

from evaluator.problems import Finding
from evaluator.validate.evidence import RunEvidence
from evaluator.validate.verdicts import Undecided, Verdict

RULE = "no_ground_truth"
NOTHING_TO_JUDGE = "nothing to judge the estimators against"
RECIPE = (
    "the recompute pass's prox_logp on some steps: AReaL's prox_logp_method: metrics, or a recompute "
    'every k-th step (docs/hook.md, "The ground truth")'
)
"""What to record, said after "record" (summary, the gate's docs) or "that the trainer records"."""


def _said(run_id: str, n_tokens: int, where: str = "") -> str:
    """`where`: where the tokens are, e.g. " in these files"."""
    counted = f"(0 of {n_tokens:,} loss tokens)"
    return f"no token of run {run_id}{where} has prox_logp {counted}: {NOTHING_TO_JUDGE}"


def no_truth_message(run_id: str, n_tokens: int, recipe: bool = True) -> str:
    """The sentence said of a stored run of `n_tokens` loss tokens none of which has `prox_logp`, with the
    recipe, or (`recipe` False) where to find it."""
    if not recipe:
        return f'{_said(run_id, n_tokens)} (docs/hook.md, "The ground truth")'
    said = f"{_said(run_id, n_tokens)}, so no error, decision figure or safe staleness"
    return f"{said}. To get them, record {RECIPE}"


def no_ground_truth(e: RunEvidence, _) -> Verdict:
    n, n_prox = int(e.cells["n"].sum()), int(e.cells["n_prox"].sum())
    if n == 0:
        return Undecided("no loss token")
    if n_prox > 0:
        return None
    return Finding(
        RULE, e.run_id, "prox_logp", n,
        f"{_said(e.run_id, n, ' in these files')}, so no error, decision figure or safe staleness",
        0.0, "no loss token with prox_logp", (), f"that the trainer records {RECIPE}",
    )  # fmt: skip
