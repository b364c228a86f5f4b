"""What replay did with each file (`FileOutcome`) and with a call (`ReplayReport`), and the `Announcer` that
hands each outcome on once the store shows it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from evaluator.problems import Finding
from evaluator.sources import Staging
from evaluator.text_table import printable

Status = Literal["ingested", "already ingested", "copy", "skipped", "unreadable", "failed"]


@dataclass
class FileOutcome:
    """What replay did with one file; `problems` are the validator's findings when it was skipped."""

    path: Path | str  # a str: the object-storage URI the file was read from
    status: Status
    n_rows: int = 0
    n_tokens: int = 0
    problems: list = field(default_factory=list)
    copy_of: Path | str | None = None
    """A copy: the file (path or URI) whose tokens are in the store, or went in first in this call."""
    resaved: bool = False
    """A copy with other bytes (the same tokens and values), rather than the same bytes."""

    def line(self) -> str:
        """One line for the terminal: `PATH: ingested (N tokens)` or the rules it broke (the path and the
        messages spelled out: `printable`)."""
        path = printable(str(self.path))
        if self.status == "ingested":
            return f"{path}: ingested ({self.n_tokens:,} loss tokens of {self.n_rows:,} rows)"
        if self.status == "already ingested":
            return f"{path}: already ingested, unchanged"
        if self.status == "copy":
            how = "re-saved copy" if self.resaved else "copy"
            same = "the same tokens and values, other bytes" if self.resaved else "the same bytes"
            of = printable(str(self.copy_of))
            return f"{path}: a {how} of {of} ({same}), ingested from there: not counted again"
        if self.status == "failed":
            return f"{path}: failed: {'; '.join(printable(p.message) for p in self.problems)}"
        found = "; ".join(
            f"{p.rule} on {printable(p.column or '-')} ({p.rows:,} rows): {printable(p.message)}"
            if p.rows
            else printable(p.message)
            if p.rule == self.status  # `PATH: unreadable: why`, the rule said once
            else f"{p.rule}: {printable(p.message)}"
            for p in self.problems
        )
        return f"{path}: {self.status}: {found}"


@dataclass
class ReplayReport:
    outcomes: list[FileOutcome]
    findings: list[Finding] = field(default_factory=list)
    """The data-driven findings on the files of this call (`evaluator.validate.findings`)."""
    ingest_s: float = 0.0
    """Seconds this process spent ingesting summaries (the single writer's share: what bounds any number
    of workers)."""

    @property
    def n_ingested(self) -> int:
        return sum(o.status == "ingested" for o in self.outcomes)

    @property
    def clean(self) -> bool:
        """True when no file was skipped for breaking a rule."""
        return all(o.status in ("ingested", "already ingested", "copy") for o in self.outcomes)


@dataclass
class Announcer:
    """Hands each outcome to `on_file` as it is settled (an ingested file is committed: readers see it),
    with the location the file was read from (its URI for a staged copy)."""

    staging: Staging
    on_file: Callable[[FileOutcome], None] | None
    outcomes: list[FileOutcome] = field(default_factory=list)

    def add(self, outcome: FileOutcome) -> None:
        outcome.path = self.staging.location(outcome.path)
        if isinstance(outcome.copy_of, Path):  # an earlier file of this call
            outcome.copy_of = self.staging.location(outcome.copy_of)
        self.outcomes.append(outcome)
        if self.on_file is not None:
            self.on_file(outcome)
