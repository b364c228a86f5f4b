"""Check of a response recorded in several minibatches of its step (PPO epochs,
`evaluator.validate.repeats`): its tokens, the engine's log-probs, its advantage and its reward are the
response's, the same in every minibatch that trains it (prox's own check is `prox_fixed`)."""

from __future__ import annotations

from evaluator.problems import Finding
from evaluator.validate.evidence import RunEvidence
from evaluator.validate.verdicts import Undecided, Verdict

REPEAT_CHANGED = 0.01
"""Repeated responses carrying another token, behave_logp, advantage or reward than at their first
minibatch: none on clean logs (the same stored values); over 1% (3 at least) is a column gathered in
another order than the responses, or recomputed, in a later minibatch."""
_RULES = {
    "token_id": ("token_id_differs_across_minibatches", "the tokens"),
    "behave_logp": ("behave_differs_across_minibatches", "the engine's log-probs"),
    "advantage": ("advantage_differs_across_minibatches", "the advantages"),
    "reward": ("reward_differs_across_minibatches", "the reward"),
}
_ADVICE = {
    "token_id": "that every column of a minibatch is gathered with the same permutation of the responses",
    "behave_logp": "that behave_logp travels with its response when minibatches are shuffled or re-batched "
    "(the engine's values are data, never recomputed per epoch)",
    "advantage": "that advantages are computed once per step and gathered with their responses (not "
    "renormalised per minibatch, nor left in the batch order when the responses are shuffled)",
    "reward": "that rewards are gathered with their responses when minibatches are shuffled or re-batched",
}


def repeated(e: RunEvidence, _) -> Verdict:
    """token_id_, behave_, advantage_, reward_differs_across_minibatches."""
    rep = e.repeats
    compared = float(rep["compared"].sum())
    if compared == 0:
        return Undecided("no response is recorded in two minibatches of its step")
    for column, (rule, what) in _RULES.items():
        changed = float(rep[f"{column}_differs"].sum())
        if changed < 3 or changed <= REPEAT_CHANGED * compared:
            continue
        return Finding(
            rule, e.run_id, column, int(changed),
            f"{int(changed):,} of {int(compared):,} responses recorded again in a later minibatch of their "
            f"step carry other values of {column} there: {what} of a response are the same in every "
            "minibatch that trains it",
            changed / compared, f"> {REPEAT_CHANGED:.0%} of the repeated responses (3+)",
            e.example(f"repeat:{column}"), _ADVICE[column],
        )  # fmt: skip
    return None
