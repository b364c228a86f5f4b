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
    "incomplete_step": "warning",
    "behave_is_prox": "error",
    "behave_is_theta": "error",
    "proximal_t_not_updated": "error",
    "proximal_t_misplaced": "error",
    "proximal_t_wrong_version": "warning",
    "loss_mask_edge": "warning",
    "version_count": "warning",
    "staleness_beyond_max": "error",
    "staleness_gap": "warning",
    "engine_mismatch": "warning",
    "prox_logp_zero": "warning",
    "no_ground_truth": "warning",
}
"""Every data-driven finding (`evaluator.validate.findings`) and its severity (the docs list each; a test
checks it)."""


@dataclass(frozen=True)
class Finding:
    rule: str
    run_id: str
    column: str | None
    rows: int
    message: str

    @property
    def severity(self) -> Severity:
        return SEVERITY[self.rule]

    def problem(self) -> Problem:
        """An error finding as the problem of each file of its run."""
        return Problem(self.rule, self.column, self.rows, f"run {self.run_id}: {self.message}")
