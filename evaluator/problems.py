"""The validator's report objects: one `Problem` per broken rule, one `FileReport` per file.

Re-exported by `evaluator.validate`; kept apart so that the rule modules can share them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


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
