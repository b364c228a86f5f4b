"""What replay did with each file (`FileOutcome`) and with a call (`ReplayReport`), and the `Announcer` that
hands each outcome on once the store shows it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from evaluator.problems import Finding
from evaluator.sources import Staging

Status = Literal["ingested", "already ingested", "skipped", "unreadable", "failed"]


@dataclass
class FileOutcome:
    """What replay did with one file; `problems` are the validator's findings when it was skipped."""

    path: Path | str  # a str: the object-storage URI the file was read from
    status: Status
    n_rows: int = 0
    n_tokens: int = 0
    problems: list = field(default_factory=list)

    def line(self) -> str:
        """One line for the terminal: `PATH: ingested (N tokens)` or the rules it broke."""
        if self.status == "ingested":
            return f"{self.path}: ingested ({self.n_tokens:,} loss tokens of {self.n_rows:,} rows)"
        if self.status == "already ingested":
            return f"{self.path}: already ingested, unchanged"
        if self.status == "failed":
            return f"{self.path}: failed: {'; '.join(p.message for p in self.problems)}"
        found = "; ".join(
            f"{p.rule} on {p.column or '-'} ({p.rows:,} rows): {p.message}"
            if p.rows
            else p.message
            if p.rule == self.status  # `PATH: unreadable: why`, the rule said once
            else f"{p.rule}: {p.message}"
            for p in self.problems
        )
        return f"{self.path}: {self.status}: {found}"


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
        return all(o.status in ("ingested", "already ingested") for o in self.outcomes)


@dataclass
class Announcer:
    """Hands each outcome to `on_file` once the store shows it ("ingested" means readers see it), with
    the location the file was read from (its URI for a staged copy)."""

    staging: Staging
    on_file: Callable[[FileOutcome], None] | None
    outcomes: list[FileOutcome] = field(default_factory=list)
    waiting: list[FileOutcome] = field(default_factory=list)

    def add(self, outcome: FileOutcome, published: bool) -> None:
        """One more outcome; `published`: the store shows every outcome so far."""
        self.waiting.append(outcome)
        if published:
            self.flush()

    def flush(self) -> None:
        for outcome in self.waiting:
            outcome.path = self.staging.location(outcome.path)
            self.outcomes.append(outcome)
            if self.on_file is not None:
                self.on_file(outcome)
        self.waiting = []
