"""Replay's units of per-file work, as the runners (`evaluator.replay.workers`, `.ray_runner`) ship them:
picklable values whose `run()` does the work where the runner puts it (this process, a worker process or
a Ray worker); a range of a long file is `evaluator.replay.summarise.SummariseRange`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from evaluator.formulas.loss import Loss
from evaluator.replay.summarise import SummariseRange, summarise_file
from evaluator.store.writer import worker_writer
from evaluator.validate import check_file


@dataclass(frozen=True)
class Check:
    """Check one file on its own (the rules of `proxaudit validate`): a `CheckedFile`."""

    path: Path
    kind = "check"

    def run(self):
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
        # one worker per core already: no range threads
        summary = summarise_file(
            self.path, self.resumes, self.loss, n_sequences=self.n_sequences, workers=1, sample=self.sample
        )
        if self.commit is None:
            return summary
        c = self.commit
        writer = worker_writer(c.db, self.loss, self.sample, c.max_staleness)
        result = writer.ingest(c.location, c.digest, summary, c.sequences, c.evidence)
        return Committed(result, summary.n_rows, summary.n_tokens)


Task = Check | Summarise | SummariseRange
