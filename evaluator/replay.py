"""`proxaudit replay`: validate token logs, replay them through every estimator, store the summaries.

Per file: digest (BLAKE2b of the bytes; a file already in the store is skipped), validate (the rules of
`proxaudit validate`; a file that breaks one is reported and skipped), summarise it streaming over record
batches with the database closed, then ingest it in one transaction (`evaluator.store.ingest`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pyarrow.parquet as pq
from tqdm import tqdm

from evaluator.errors import NothingReadableError
from evaluator.file_summary import summarise_file
from evaluator.store import file_digest, ingest, ingested_digests
from evaluator.validate import find_parquet_files, validate_file

Status = Literal["ingested", "already ingested", "skipped", "unreadable"]


@dataclass
class FileOutcome:
    """What replay did with one file; `problems` are the validator's findings when it was skipped."""

    path: Path
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
        found = "; ".join(
            f"{p.rule} on {p.column or '-'} ({p.rows:,} rows): {p.message}"
            if p.rows
            else f"{p.rule}: {p.message}"
            for p in self.problems
        )
        return f"{self.path}: {self.status}: {found}"


@dataclass
class ReplayReport:
    outcomes: list[FileOutcome]

    @property
    def n_ingested(self) -> int:
        return sum(o.status == "ingested" for o in self.outcomes)

    @property
    def clean(self) -> bool:
        """True when no file was skipped for breaking a rule."""
        return all(o.status in ("ingested", "already ingested") for o in self.outcomes)


def _progress(files: list[Path], enabled: bool | None) -> tqdm:
    """Files, tokens and tokens/s on stderr, only when stderr is a terminal (quiet in CI)."""
    rows = 0
    for path in files:
        try:
            rows += pq.ParquetFile(path).metadata.num_rows
        except Exception:  # an unreadable file is reported by validation, not here
            continue
    disable = not sys.stderr.isatty() if enabled is None else not enabled
    return tqdm(total=rows, unit="tok", unit_scale=True, desc=f"0/{len(files)} files", disable=disable)


def replay_file(path: Path, db_path: Path, known: set[str], on_rows: Callable[[int], None]) -> FileOutcome:
    """Replay one file into the store (see the module docstring)."""
    digest = file_digest(path)
    if digest in known:
        return FileOutcome(path, "already ingested")
    report = validate_file(path)
    if not report.ok:
        return FileOutcome(
            path, "skipped" if report.readable else "unreadable", problems=list(report.problems)
        )
    summary = summarise_file(path, on_batch=on_rows)
    if not ingest(db_path, path, digest, summary):
        return FileOutcome(path, "already ingested")
    known.add(digest)
    return FileOutcome(path, "ingested", n_rows=summary.n_rows, n_tokens=summary.n_tokens)


def replay(
    paths: Sequence[str | os.PathLike],
    db_path: str | os.PathLike,
    *,
    on_file: Callable[[FileOutcome], None] | None = None,
    progress: bool | None = None,
) -> ReplayReport:
    """Replay every Parquet file under `paths` into the store at `db_path` (created if missing).

    Raises `UsageError` for a missing path and `NothingReadableError` when no file could be read."""
    files = find_parquet_files([Path(p) for p in paths])
    if not files:
        raise NothingReadableError(f"no Parquet files under {', '.join(map(str, paths))}")
    db_path = Path(db_path)
    known = ingested_digests(db_path)
    outcomes = []
    with _progress(files, progress) as bar:
        for i, path in enumerate(files):
            outcome = replay_file(path, db_path, known, bar.update)
            outcomes.append(outcome)
            bar.set_description(f"{i + 1}/{len(files)} files")
            if on_file is not None:
                on_file(outcome)
    if all(o.status == "unreadable" for o in outcomes):
        raise NothingReadableError("no input file could be read: " + "; ".join(o.line() for o in outcomes))
    return ReplayReport(outcomes)
