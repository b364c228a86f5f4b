"""Replay's units of per-file work, as the runners (`evaluator.replay.workers`, `.ray_runner`) ship them:
picklable values whose `run()` does the work where the runner puts it (this process, a worker process or
a Ray worker); a range of a long file is `evaluator.replay.summarise.SummariseRange`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from evaluator.formulas.loss import Loss
from evaluator.replay.summarise import BATCH_ROWS, SummariseRange, summarise_file
from evaluator.store import StoreWriter
from evaluator.validate import check_file

_WORKER_WRITERS: dict[tuple, StoreWriter] = {}


def worker_writer(db: str, loss: Loss, sample: float, max_staleness: int | None) -> StoreWriter:
    """The writer a worker process (a Ray worker) stages its files with, opened once per process and
    store and kept (the process's end closes it); the replay that handed out the files commits them and
    computes the derived rows."""
    key = (db, json.dumps(loss.to_dict()), sample, max_staleness)
    if key not in _WORKER_WRITERS:
        _WORKER_WRITERS[key] = StoreWriter(db, loss, max_staleness=max_staleness, sample=sample).__enter__()
    return _WORKER_WRITERS[key]


@dataclass(frozen=True)
class Check:
    """Check one file on its own (the rules of `proxaudit validate`): a `CheckedFile`."""

    path: Path
    kind = "check"

    def run(self):
        return check_file(self.path)


@dataclass(frozen=True)
class StageTo:
    """The store a task stages the file it summarised for (a Ray worker writes its own files' Parquet
    files; the replay registers them in group commits), and what staging needs besides the summary
    (`evaluator.store.StoreWriter.stage`)."""

    db: str
    digest: str
    location: Path | str
    sequences: pa.Table
    evidence: object | None
    max_staleness: int | None = None


@dataclass(frozen=True)
class Summarise:
    """Summarise one clean file (`FileFacts.resumes` and the number of its sequences from its check) under
    `loss`, the fraction `sample` of its sequences, in record batches of `batch_rows`: a `FileSummary`; with
    `stage`, its Parquet files written for that store from where it runs: a `StagedFile` (or the `Problem`
    of a file the store cannot keep)."""

    path: Path
    resumes: pa.Table
    loss: Loss
    n_sequences: int | None = None
    sample: float = 1.0
    stage: StageTo | None = None
    batch_rows: int = BATCH_ROWS
    kind = "summarise"

    def run(self):
        # one worker per core already: no range threads
        summary = summarise_file(
            self.path, self.resumes, self.loss, n_sequences=self.n_sequences, batch_rows=self.batch_rows,
            workers=1, sample=self.sample,
        )  # fmt: skip
        if self.stage is None:
            return summary
        s = self.stage
        writer = worker_writer(s.db, self.loss, self.sample, s.max_staleness)
        return writer.stage(s.location, s.digest, summary, s.sequences, s.evidence)


Task = Check | Summarise | SummariseRange
