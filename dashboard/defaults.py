"""Which methods every chart draws until the user picks others: the method the gate judges and the options
the trainer offers, so a page opens on the decision at hand rather than on all ten methods; the others stay
one click away in the sidebar."""

from __future__ import annotations

from pathlib import Path

from evaluator.errors import InputFileError, ThresholdsError
from evaluator.gate.judge import load_thresholds
from schemas.thresholds import DEFAULT_THRESHOLDS

AREAL_OPTIONS = ("loglinear_shipped", "linear_shipped", "rollout")
"""AReaL's approximations (`ProxApproxMethod` in `areal/utils/constants.py`, inclusionAI/AReaL at 8a03296:
loglinear, linear, rollout) as its code computes them: loglinear and linear with its shipped version
pairing, rollout as behave_logp."""


def gated_methods(thresholds: Path | None) -> list[str]:
    """The methods the thresholds' checks name (the default thresholds without a file); none for a file
    that does not parse (the Overview's banner says why)."""
    try:
        checks = load_thresholds(thresholds or DEFAULT_THRESHOLDS).checks
    except (ThresholdsError, InputFileError):
        return []
    return list(dict.fromkeys(c.method for c in checks if c.method))


def default_methods(present: list[str], thresholds: Path | None) -> list[str]:
    """Of the estimators `present` (in their order), the gated ones and AReaL's options; all of them when
    the store holds none of those."""
    wanted = {*gated_methods(thresholds), *AREAL_OPTIONS}
    return [m for m in present if m in wanted] or list(present)
