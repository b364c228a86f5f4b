"""Replay's units of per-file work, as the runners (`evaluator.replay.workers`, `.ray_runner`) ship them:
picklable values whose `run()` does the work where the runner puts it (this process, a worker process or
a Ray worker). Each imports what it needs when first run, so a worker pays it once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from evaluator.formulas.loss import Loss


@dataclass(frozen=True)
class Check:
    """Check one file on its own (the rules of `proxaudit validate`): a `CheckedFile`."""

    path: Path
    kind = "check"

    def run(self):
        from evaluator.validate import check_file

        return check_file(self.path)


@dataclass(frozen=True)
class CommitTo:
    """Where a task commits the file it summarised (a Ray worker commits its own files): the store, and
    what the ingest needs besides the summary (`evaluator.store.StoreWriter.ingest`)."""

    db: str
    digest: str
    location: Path | str
    sequences: pa.Table
    evidence: object | None
    max_staleness: int | None = None


@dataclass(frozen=True)
class Committed:
    """A file a worker summarised and committed (or found in the store): what its ingest returned."""

    result: object
    n_rows: int
    n_tokens: int


@dataclass(frozen=True)
class Summarise:
    """Summarise one clean file (`FileFacts.resumes` and the number of its sequences from its check) under
    `loss`, the fraction `sample` of its sequences: a `FileSummary`; with `commit`, also commit it to that
    store from where it runs: `Committed`."""

    path: Path
    resumes: pa.Table
    loss: Loss
    n_sequences: int | None = None
    sample: float = 1.0
    commit: CommitTo | None = None
    kind = "summarise"

    def run(self):
        from evaluator.replay.summarise import summarise_file

        # one worker per core already: no range threads
        summary = summarise_file(
            self.path, self.resumes, self.loss, n_sequences=self.n_sequences, workers=1, sample=self.sample
        )
        if self.commit is None:
            return summary
        from evaluator.store.writer import worker_writer

        c = self.commit
        writer = worker_writer(c.db, self.loss, self.sample, c.max_staleness)
        result = writer.ingest(c.location, c.digest, summary, c.sequences, c.evidence)
        return Committed(result, summary.n_rows, summary.n_tokens)


@dataclass(frozen=True)
class SummariseRange:
    """Summarise rows [start, end) of a long file (`rows` None: all of it) in record batches of
    `batch_rows`, the fraction `sample` of its sequences (`evaluator.replay.sampling`): a `RangeSummary`,
    merged with the file's other ranges in file order."""

    path: Path
    rows: tuple[int, int] | None
    resumes: pa.Table
    loss: Loss
    batch_rows: int
    sample: float = 1.0
    kind = "summarise_range"

    def run(self, on_batch: Callable[[int], None] | None = None, stop: threading.Event | None = None):
        from evaluator.replay.summarise import summarise_range

        return summarise_range(self, on_batch=on_batch, stop=stop)


Task = Check | Summarise | SummariseRange
