"""`proxaudit replay`: validate token logs, replay them through every estimator, store the summaries.

Per file: digest (BLAKE2b of the bytes; a file already in the store is skipped), validate (the rules of
`proxaudit validate`; a file that breaks one is reported and skipped), summarise it streaming over record
batches, then ingest it in one transaction (`evaluator.store.StoreWriter.ingest`).

Files are ingested one by one in sorted order, each in its own transaction, into the store's working
copy, which is published as it goes (`evaluator.store.StoreWriter`): readers never wait for a replay.
With several files, the next ones are validated and summarised in worker processes, one file per worker
(`evaluator.summary_pool`), while this process digests and ingests; a file long enough to be cut into
ranges (`evaluator.file_summary.default_workers`) uses the range workers instead. The stored numbers do
not depend on which process summarised a file.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import duckdb
import pyarrow.parquet as pq
from tqdm import tqdm

from evaluator.decisions import DEFAULT_PARAMS, DecisionParams
from evaluator.errors import FileFailed, NothingReadableError
from evaluator.file_summary import BATCH_ROWS, FileSummary, default_workers, summarise_file
from evaluator.problems import Problem
from evaluator.store import StoreWriter, file_digest
from evaluator.summary_pool import SummaryPool, Worker
from evaluator.validate import CheckedFile, check_file, find_parquet_files

Status = Literal["ingested", "already ingested", "skipped", "unreadable", "failed"]


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
        if self.status == "failed":
            return f"{self.path}: failed: {'; '.join(p.message for p in self.problems)}"
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


@dataclass
class Summarised:
    """A file checked (`CheckedFile`) and, if it broke no rule, summarised: what a pool worker returns."""

    checked: CheckedFile
    summary: FileSummary | None = None


def check_and_summarise(
    path: Path,
    params: DecisionParams = DEFAULT_PARAMS,
    *,
    batch_rows: int = BATCH_ROWS,
    workers: int | None = None,
    on_batch=None,
) -> Summarised:
    """Validate `path` and, if it breaks no rule, summarise it (`summarise_file`); what a pool worker does."""
    checked = check_file(path)
    if checked.facts is None:
        return Summarised(checked)
    resumes = checked.facts.resumes
    summary = summarise_file(path, resumes, params, on_batch=on_batch, batch_rows=batch_rows, workers=workers)
    return Summarised(checked, summary)


def _outcome(path: Path, digest: str, done: Summarised, store: StoreWriter, known: set[str]) -> FileOutcome:
    """Ingest a summarised file, or report the rules it broke (the store's own: a repeated token)."""
    report, summary = done.checked.report, done.summary
    if summary is None:
        status = "skipped" if report.readable else "unreadable"
        return FileOutcome(path, status, problems=list(report.problems))
    ingested = store.ingest(path, digest, summary, done.checked.facts.sequences)
    if isinstance(ingested, Problem):
        return FileOutcome(path, "skipped", problems=[ingested])
    if not ingested:
        return FileOutcome(path, "already ingested")
    known.add(digest)
    return FileOutcome(path, "ingested", n_rows=summary.n_rows, n_tokens=summary.n_tokens)


def _failed(path: Path, error: Exception) -> FileOutcome:
    """The outcome of a file whose replay failed for a reason of its own: reported, the others go on."""
    why = str(error) if isinstance(error, FileFailed) else f"{type(error).__name__}: {error}"
    return FileOutcome(path, "failed", problems=[Problem("failed", None, 0, why)])


def _digest(path: Path) -> str | FileOutcome:
    """The file's digest, or the outcome of a file that cannot be read at all (permissions, a vanished
    file): reported like any unreadable file."""
    try:
        return file_digest(path)
    except OSError as error:
        return FileOutcome(
            path, "unreadable", problems=[Problem("unreadable", None, 0, f"cannot read it: {error}")]
        )


def _ingest(path: Path, digest: str, done: Summarised, store: StoreWriter, known: set[str]) -> FileOutcome:
    """`_outcome`, with an unexpected error in the ingest (rolled back) reported as this file's failure."""
    try:
        return _outcome(path, digest, done, store, known)
    except (duckdb.Error, FileFailed) as error:
        return _failed(path, error)


def replay_file(
    path: Path,
    store: StoreWriter,
    known: set[str],
    params: DecisionParams,
    on_rows: Callable[[int], None],
    digest: str | None = None,
) -> FileOutcome:
    """Replay one file into the store (see the module docstring), all of it in this process (and its
    range workers); whatever goes wrong with this file is its outcome, never an exception."""
    digest = digest or _digest(path)
    if isinstance(digest, FileOutcome):
        return digest
    if digest in known:
        return FileOutcome(path, "already ingested")
    try:
        done = check_and_summarise(path, params, on_batch=on_rows)
    except Exception as error:  # one file's trouble never stops the others
        return _failed(path, error)
    return _ingest(path, digest, done, store, known)


def _n_rows(path: Path) -> int:
    """Rows in the file's footer (0 if unreadable: validation says why)."""
    try:
        return pq.ParquetFile(path).metadata.num_rows
    except Exception:
        return 0


@dataclass
class _InFlight:
    """A file handed to a pool worker, and once it has answered, its report and summary."""

    path: Path
    digest: str
    worker: Worker | None
    done: Summarised | FileFailed | None = None


class _Pipeline:
    """Files in order, each an outcome or in flight; the oldest is reported as soon as it is known."""

    def __init__(self, pool: SummaryPool, store: StoreWriter, known: set[str], on_rows, on_file) -> None:
        self.pool, self.store, self.known = pool, store, known
        self.on_rows, self.on_file = on_rows, on_file
        self.queue: deque[FileOutcome | _InFlight] = deque()

    def collect(self) -> None:
        """Wait for the answer of the oldest file still in flight, which frees its worker."""
        job = next(j for j in self.queue if isinstance(j, _InFlight) and j.done is None)
        try:
            job.done = self.pool.result(job.worker, job.path)
        except FileFailed as error:
            job.done = error
            return
        self.on_rows(job.done.summary.n_rows if job.done.summary is not None else 0)

    def submit(self, path: Path, digest: str) -> None:
        """Hand `path` to a worker, first waiting for one to be free."""
        if self.pool.full():
            self.collect()
        try:
            self.queue.append(_InFlight(path, digest, self.pool.submit(path)))
        except FileFailed as error:
            self.queue.append(_InFlight(path, digest, None, error))

    def report_ready(self) -> None:
        """Report (ingesting the summarised ones) the oldest files whose outcome is known, in order."""
        while self.queue and (isinstance(self.queue[0], FileOutcome) or self.queue[0].done is not None):
            head = self.queue.popleft()
            if isinstance(head, _InFlight) and isinstance(head.done, FileFailed):
                head = _failed(head.path, head.done)
            elif isinstance(head, _InFlight):
                head = _ingest(head.path, head.digest, head.done, self.store, self.known)
            self.on_file(head)

    def finish(self) -> None:
        """Report every file in the queue, waiting for those in flight."""
        while self.queue:
            self.report_ready()
            if self.queue:
                self.collect()


def _replay_parallel(
    files: list[Path],
    store: StoreWriter,
    known: set[str],
    params: DecisionParams,
    workers: int,
    on_rows,
    on_file,
) -> None:
    """Replay `files` in order, validating and summarising the next files on `workers` processes while
    this one ingests (a worker gets its next file before the parent ingests its last one). Each file is
    still ingested alone and in order; a file long enough for range workers (`default_workers`) is
    replayed with them once every earlier file is in."""
    with SummaryPool(workers, params) as pool:
        pipeline = _Pipeline(pool, store, known, on_rows, on_file)
        for path in files:
            digest = _digest(path)
            if isinstance(digest, FileOutcome):
                pipeline.queue.append(digest)
            elif digest in known:
                pipeline.queue.append(FileOutcome(path, "already ingested"))
            elif default_workers(_n_rows(path)) > 1:
                pipeline.finish()
                on_file(replay_file(path, store, known, params, on_rows, digest))
            else:
                pipeline.submit(path, digest)
            pipeline.report_ready()
        pipeline.finish()


def file_workers(n_files: int) -> int:
    """Worker processes over files: one per usable core when there are several files, else none."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores if n_files > 1 else 1


def replay(
    paths: Sequence[str | os.PathLike],
    db_path: str | os.PathLike,
    *,
    on_file: Callable[[FileOutcome], None] | None = None,
    progress: bool | None = None,
    workers: int | None = None,
    params: DecisionParams = DEFAULT_PARAMS,
) -> ReplayReport:
    """Replay every Parquet file under `paths` into the store at `db_path` (created if missing), in sorted
    order, summarising files on `workers` processes (default `file_workers`; 1: all in this process), with
    the loss's thresholds `params` for the decision metrics (recorded in the store; a store made with
    other parameters is refused).

    Raises `UsageError` for a missing path, `NothingReadableError` when no file could be read and
    `StoreError` for a store of other parameters."""
    files = find_parquet_files([Path(p) for p in paths])
    if not files:
        raise NothingReadableError(f"no Parquet files under {', '.join(map(str, paths))}")
    workers = file_workers(len(files)) if workers is None else workers
    outcomes, pending = [], []  # pending: known, but the store does not show them yet

    def report() -> None:
        """Hand the outcomes to `on_file` once the store shows them ("ingested" means readers see it)."""
        while pending:
            outcome = pending.pop(0)
            outcomes.append(outcome)
            if on_file is not None:
                on_file(outcome)

    try:
        with StoreWriter(db_path, params) as store, _progress(files, progress) as bar:
            known = store.digests()

            def done(outcome: FileOutcome) -> None:
                pending.append(outcome)
                bar.set_description(f"{len(outcomes) + len(pending)}/{len(files)} files")
                if not store.unpublished:
                    report()

            if workers > 1:
                _replay_parallel(files, store, known, params, workers, bar.update, done)
            else:
                for path in files:
                    done(replay_file(path, store, known, params, bar.update))
    finally:
        report()  # after the last publish, also after an error or Ctrl-C (the store keeps what it ingested)
    if all(o.status == "unreadable" for o in outcomes):
        raise NothingReadableError("no input file could be read: " + "; ".join(o.line() for o in outcomes))
    return ReplayReport(outcomes)
