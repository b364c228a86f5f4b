"""The finding `no_ground_truth` (a warning): no loss token of a run has `prox_logp` in the files of the call,
so nothing judges the estimators: every error, decision figure and safe staleness needs the recompute's
log-prob. The usual production run skips the recompute pass (AReaL's `prox_logp_method: loglinear`).

Its sentence is also what `summary` and the gate say of a stored run without ground truth
(`no_truth_message`), with the recipe of `docs/hook.md`.
"""

from __future__ import annotations

from evaluator.problems import Finding
from evaluator.validate.evidence import RunEvidence

RULE = "no_ground_truth"
NOTHING_TO_JUDGE = "nothing to judge the estimators against"
RECIPE = (
    "record the recompute pass's prox_logp on some steps: AReaL's prox_logp_method: metrics, or a "
    'recompute every k-th step (docs/hook.md, "The ground truth")'
)


def no_truth_message(run_id: str, n_tokens: int, where: str = "", recipe: bool = True) -> str:
    """The sentence said of a run of `n_tokens` loss tokens none of which has `prox_logp` (`where`: where
    the tokens are, e.g. " in these files"), with the recipe or (`recipe` False) where to find it."""
    said = f"no token of run {run_id}{where} has prox_logp (0 of {n_tokens:,} loss tokens)"
    said += f": {NOTHING_TO_JUDGE}"
    if not recipe:
        return f'{said} (docs/hook.md, "The ground truth")'
    return f"{said}, so no error, decision figure or safe staleness. To get them, {RECIPE}"


def no_ground_truth(e: RunEvidence, _) -> Finding | None:
    n, n_prox = int(e.cells["n"].sum()), int(e.cells["n_prox"].sum())
    if n == 0 or n_prox > 0:
        return None
    message = no_truth_message(e.run_id, n, " in these files") + ". Check that the trainer records it"
    return Finding(RULE, e.run_id, "prox_logp", n, message)
