"""Replay's files committed in groups: each summarised file is staged as it arrives (its Parquet files
written, here or by the worker that summarised it), and the staged files of up to `GROUP_FILES` files are
registered in one commit of the store (`evaluator.store.StoreWriter.commit`), which pays the commit's fixed
cost once per group. Outcomes are handed on in the files' order, once the group that holds them is
committed (readers then see the group's files, all at once)."""

from __future__ import annotations

import time
from pathlib import Path

import duckdb

from evaluator.errors import FileFailed
from evaluator.problems import Problem
from evaluator.replay.outcomes import Announcer, FileOutcome
from evaluator.replay.slots import Slot
from evaluator.store import FileSummary, StoreWriter
from evaluator.store.group import Result, StagedFile
from evaluator.store.repeats import CopyOf

GROUP_FILES = 8
"""The most files one commit registers: the commit's fixed cost (DuckLake's snapshot in the catalog, about
60 ms of CPU, BENCHMARKS.md) is paid once per this many files, and a kill loses at most this many files'
work."""
GROUP_WAIT_S = 5.0
"""A group is committed sooner once its first file has waited this long (checked as each file arrives), so
readers see slow files within seconds of their summary."""


class Groups:
    """A context manager taking replay's slots in order (`add`): their outcomes once the group that holds
    them is committed; on leaving, the last group is committed (or, after an error, its staged files are
    deleted)."""

    def __init__(self, store: StoreWriter, announcer: Announcer) -> None:
        self.store, self.announcer = store, announcer
        self.slots: list[tuple[Slot, StagedFile | FileOutcome | None]] = []
        self.first = 0.0

    def __enter__(self) -> Groups:
        return self

    def __exit__(self, kind, value, trace) -> None:
        if kind is None:
            self.flush()
        else:
            self.store.discard([s for _, s in self.slots if isinstance(s, StagedFile)])

    def add(self, slot: Slot, summary, location: Path | str) -> None:
        """The slot with its summary (a `FileSummary`, a worker's `StagedFile` or `Problem`, a
        `FileFailed`, or None: a slot not summarised), staged; the group committed when it is due."""
        settled = _staged(slot, summary, location, self.store)
        staged = [s for _, s in self.slots if isinstance(s, StagedFile)]
        if isinstance(settled, StagedFile) and not staged:
            self.first = time.perf_counter()
        self.slots.append((slot, settled))
        n = len(staged) + isinstance(settled, StagedFile)
        if n >= GROUP_FILES or (n and time.perf_counter() - self.first >= GROUP_WAIT_S):
            self.flush()

    def flush(self) -> None:
        """Commit the group's staged files in one transaction, then hand on every slot's outcome in order."""
        slots, self.slots = self.slots, []  # committed or not, no longer this group's to delete
        staged = [s for _, s in slots if isinstance(s, StagedFile)]
        results = iter(self.store.commit(staged) if staged else ())
        for slot, settled in slots:
            if isinstance(settled, StagedFile):
                settled = _ingested(slot.path, settled, next(results))
            slot.outcome = settled or slot.resolve()  # a copy of an earlier file takes its outcome
            self.announcer.add(slot.outcome)


def _staged(slot: Slot, summary, location: Path | str, store: StoreWriter) -> StagedFile | FileOutcome | None:
    """The slot's file staged for a commit (as `location`: its path, or the URI it was copied from), or
    its outcome known without one: from its check (no summary), its summary's failure, a rule of the
    store it breaks, or an unexpected error in staging (this file's failure); None: known from its digest
    once the earlier files' outcomes are (`Slot.resolve`)."""
    if summary is None:
        return slot.outcome
    if isinstance(summary, FileFailed):
        return failed(slot.path, summary)
    if isinstance(summary, FileSummary):
        facts = slot.checked
        try:
            summary = store.stage(location, slot.digest, summary, facts.facts.sequences, facts.evidence)
        except (duckdb.Error, FileFailed) as error:
            return failed(slot.path, error)
    if isinstance(summary, Problem):
        return FileOutcome(slot.path, "skipped", problems=[summary])
    return summary


def _ingested(path: Path, staged: StagedFile, result: Result | duckdb.Error) -> FileOutcome:
    """The outcome of the file at `path`, staged, from what its commit gave."""
    if isinstance(result, duckdb.Error):
        return failed(path, result)
    if isinstance(result, Problem):
        return FileOutcome(path, "skipped", problems=[result])
    if isinstance(result, CopyOf):
        return FileOutcome(path, "copy", copy_of=result.path, resaved=True)
    if not result:
        return FileOutcome(path, "already ingested")
    return FileOutcome(path, "ingested", n_rows=staged.n_rows, n_tokens=staged.n_tokens)


def failed(path: Path | str, error: Exception) -> FileOutcome:
    """The outcome of a file whose replay failed for a reason of its own: reported, the others go on."""
    why = str(error) if isinstance(error, FileFailed) else f"{type(error).__name__}: {error}"
    return FileOutcome(path, "failed", problems=[Problem("failed", None, 0, why)])
