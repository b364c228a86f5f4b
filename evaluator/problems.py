"""The validator's report objects: one `Problem` per broken rule, one `FileReport` per file, one
`Finding` per data-driven finding about a run. Below every stage, so that the validator, the store and
replay share them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal


@dataclass(frozen=True)
class Problem:
    """One broken rule in one file."""

    rule: str
    """Stable id, e.g. `missing_column`, `positive_logp`, `misaligned_logp`."""
    column: str | None
    rows: int
    """How many rows break it (0 where the rule is not row-based)."""
    message: str
    """Found vs expected, with an example seq_id/pos where there is one."""


@dataclass
class FileReport:
    """The verdict on one file: `ok` when no rule is broken; `notes` say what was checked and how."""

    path: Path | str  # a str: the object-storage URI the file was read from
    n_rows: int | None
    problems: list[Problem]
    notes: list[str] = field(default_factory=list)
    """Sampling, inconclusive audit checks: information, never a failure."""

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def readable(self) -> bool:
        """The file could be opened and read as Parquet."""
        return not any(p.rule == "unreadable" for p in self.problems)


def format_key(example: dict) -> str:
    """`{'seq_id': 7, 'pos': 3}` -> `seq_id 7 pos 3`."""
    return " ".join(f"{k} {v}" for k, v in example.items())


Severity = Literal["error", "warning"]

SEVERITY: dict[str, Severity] = {
    "theta_not_prox_at_minibatch_0": "warning",
    "theta_equals_prox": "warning",
    "theta_gap_order": "warning",
    "prox_moves_with_theta": "warning",
    "prox_differs_across_minibatches": "error",
    "incomplete_step": "warning",
    "n_minibatches_varies": "warning",
    "behave_is_prox": "error",
    "behave_is_theta": "error",
    "behave_placeholder": "warning",
    "proximal_t_not_updated": "error",
    "proximal_t_partial_update": "error",
    "proximal_t_is_prox": "error",
    "proximal_t_misplaced": "error",
    "proximal_t_wrong_version": "warning",
    "proximal_t_last_segment": "warning",
    "loss_mask_empty": "error",
    "loss_mask_edge": "warning",
    "loss_mask_truncated": "warning",
    "loss_mask_fragmented": "warning",
    "loss_mask_movement": "warning",
    "version_count": "warning",
    "version_stalled": "warning",
    "drift_not_growing": "warning",
    "staleness_beyond_max": "error",
    "staleness_gap": "warning",
    "engine_mismatch": "warning",
    "advantage_varies": "warning",
    "advantage_misaligned": "warning",
    "advantage_not_centred": "warning",
    "advantage_against_reward": "error",
    "advantage_ignores_reward": "warning",
    "advantage_against_movement": "warning",
    "reward_varies": "warning",
    "reward_constant": "warning",
    "prox_logp_zero": "warning",
    "no_ground_truth": "warning",
    "logp_sentinel": "error",
    "logp_placeholder": "warning",
    "logp_low_precision": "warning",
    "logp_per_sequence": "error",
    "prox_logp_partial": "error",
    "advantage_partial": "warning",
    "reward_partial": "warning",
    "token_id_negative": "error",
    "token_id_constant": "error",
    "behave_mixed_source": "warning",
    "behave_below_prox": "warning",
    "drift_follows_step": "warning",
    "versions_slower_than_steps": "warning",
    "token_id_differs_across_minibatches": "error",
    "behave_differs_across_minibatches": "error",
    "advantage_differs_across_minibatches": "warning",
    "reward_differs_across_minibatches": "warning",
}
"""Every data-driven finding (`evaluator.validate.findings`) and its severity (the docs list each; a test
checks it)."""


def format_example(example: dict) -> str:
    """`{'step': 3, 'seq_id': 7, 'minibatch': 0, 'pos': 2}` -> `step 3 seq_id 7 minibatch 0 pos 2`."""
    return " ".join(f"{k} {v}" for k, v in example.items() if v is not None)


@dataclass(frozen=True)
class Finding:
    """A data-driven finding about a run, with the evidence a person can check in a minute."""

    rule: str
    run_id: str
    column: str | None
    rows: int
    """The tokens (or responses, pairs: said in the message) the evidence is about."""
    message: str
    """What was seen, in a sentence with its figures."""
    figure: float | None = None
    """The figure the threshold judges."""
    threshold: str = ""
    """The threshold it crossed, e.g. `>= 0.95`."""
    examples: tuple[dict, ...] = ()
    """A few tokens that carry the signal: {step, seq_id, minibatch, pos}."""
    advice: str = ""
    """What to check in the trainer, in one line."""

    @property
    def severity(self) -> Severity:
        return SEVERITY[self.rule]

    @property
    def text(self) -> str:
        """The message, the examples and what to check, as one paragraph."""
        where = "; ".join(format_example(e) for e in self.examples)
        return " ".join(
            part
            for part in (
                f"{self.message}.",
                f"E.g. {where}." if where else "",
                f"Check {self.advice}." if self.advice else "",
            )
            if part
        )

    def problem(self) -> Problem:
        """An error finding as the problem of each file of its run."""
        return Problem(self.rule, self.column, self.rows, f"run {self.run_id}: {self.text}")


CheckStatus = Literal["passed", "found", "undecided"]


@dataclass(frozen=True)
class CheckOutcome:
    """What one check of the findings made of one run: passed, found (a finding), or undecided (the data
    cannot decide: a column absent, one minibatch, too few tokens), with why."""

    check: str
    run_id: str
    status: CheckStatus
    why: str = ""
