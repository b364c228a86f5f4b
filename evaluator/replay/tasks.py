"""Replay's units of per-file work, as the runners (`evaluator.replay.workers`, `.ray_runner`) ship them:
picklable values whose `run()` does the work where the runner puts it (this process, a worker process or
a Ray worker); a range of a long file is `evaluator.replay.summarise.SummariseRange`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from evaluator.formulas.loss import Loss
from evaluator.replay.summarise import SummariseRange, summarise_file
from evaluator.validate import check_file


@dataclass(frozen=True)
class Check:
    """Check one file on its own (the rules of `proxaudit validate`): a `CheckedFile`."""

    path: Path
    kind = "check"

    def run(self):
        return check_file(self.path)


@dataclass(frozen=True)
class Summarise:
    """Summarise one clean file (`FileFacts.resumes` and the number of its sequences from its check) under
    `loss`: a `FileSummary`."""

    path: Path
    resumes: pa.Table
    loss: Loss
    n_sequences: int | None = None
    kind = "summarise"

    def run(self):
        # one worker per core already: no range threads
        return summarise_file(self.path, self.resumes, self.loss, n_sequences=self.n_sequences, workers=1)


Task = Check | Summarise | SummariseRange
