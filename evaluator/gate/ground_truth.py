"""A run without ground truth at the gate: its checks that need `prox_logp` fail as `missing_metric` (never a
pass) and say why in the words `validate` and `summary` use (`evaluator.validate.no_truth`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from evaluator.gate.verdicts import Verdict
from evaluator.validate.no_truth import no_truth_message


def explained(verdicts: Sequence[Verdict], without_truth: dict[str, int]) -> list[Verdict]:
    """The verdicts, each `missing_metric` of a run in `without_truth` (`{run_id: loss tokens}` of the runs
    none of whose tokens has prox_logp) with that reason."""
    return [
        replace(v, reason=no_truth_message(repr(v.run_id), without_truth[v.run_id], recipe=False))
        if v.outcome == "missing_metric" and v.run_id in without_truth
        else v
        for v in verdicts
    ]
