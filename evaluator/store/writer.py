"""A writer of the metrics store (a DuckLake: `evaluator.store.lake`): any number at once, on one machine or
several, never blocking a reader.

Each file's rows are written as Parquet files before any transaction (`stage`, `evaluator.store.staging`:
here, or in the worker that summarised it), and one transaction registers those of a group of files
(`commit`, `evaluator.store.group`), committed as one snapshot: a file's cost is its rows, not the
store's, the commit's fixed cost is paid once per group, and the serial part is small. A reader sees a
group whole or not at all. A DuckLake has no unique constraints, so the rules "each file ingested once"
(by its digest) and "a token stored at most once" are checked inside the transaction, which also bumps
the one row of `ingest_ticket`: two writers that commit at once conflict, the second's commit fails and
`evaluator.store.commits.committed` runs it again on the newer snapshot, where it finds the first's
files. What is judged on a whole run (findings, checks,
intervals) is recomputed from the stored per-file rows when a writer closes (`evaluator.store.derived`).
A kill at any point leaves the store as of its last commit; the next replay finishes the work.

Readers open the store with `evaluator.store.reader.open_store`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from evaluator.duck import arrow_view, literal
from evaluator.formulas.loss import DEFAULT_LOSS, Loss
from evaluator.problems import Problem
from evaluator.sources import recorded_location
from evaluator.store import checks, derived
from evaluator.store.commits import Rollback, T, committed
from evaluator.store.group import Result, StagedFile, check, entangled, register, staged_file
from evaluator.store.lake import (
    STORE,
    Location,
    attach,
    attach_on,
    catalog_inode,
    detach,
    locate,
    made_whole,
)
from evaluator.store.reader import MAX_STALENESS_KEY
from evaluator.store.setup import set_up
from evaluator.store.staging import FileSummary, Stager
from evaluator.validate.evidence import Evidence

MERGE_MIN_ROWS = 1 << 20
"""A writer merges the staleness sketches of the runs it wrote (`evaluator.store.derived.merge_sketches`)
once the rows it added since the last merge outnumber the merged ones and this many: merging costs O(1)
per row, and a reader never scans much more than a merged sketch."""


class StoreWriter:
    """A writer of a store, as a context manager: `digests`, `ingest`; on exit the derived rows of every
    run whose files changed. `loss` and `sample` (the fraction of sequences summarised) are recorded with
    the first replay; a store made under others is refused. `max_staleness` is the trainer's, for the
    findings. `data_path` places a new store's Parquet files (a folder or an s3:// prefix)."""

    def __init__(
        self,
        db: str | os.PathLike,
        loss: Loss = DEFAULT_LOSS,
        *,
        max_staleness: int | None = None,
        sample: float = 1.0,
        data_path: str | None = None,
        merge: bool = True,
    ) -> None:
        self.location = locate(db, data_path)
        self.merge = merge
        """merge the runs' staleness sketches as rows pile up and at the end (False: the caller does,
        `evaluator.store.maintenance.merge_run_sketches`; until then readers add up a run's rows over its
        files, as they do for another writer's files)"""
        self.db = self.location.given
        self.loss, self.max_staleness, self.sample = loss, max_staleness, float(sample)
        self.con: duckdb.DuckDBPyConnection | None = None
        self._attached = self.location  # the store the connection writes (a new one's staged folder at first)
        self._stager: Stager | None = None
        self._unmerged_runs: set[str] = set()
        self._merged_rows = self._unmerged_rows = 0  # staleness sketch rows at the last merge, and since
        self.commit_s = 0.0
        """Seconds spent in ingest transactions (checks, registering the staged files, the commit): the part
        of ingesting that is one at a time per store."""

    def __enter__(self) -> StoreWriter:
        if self.location.exists():
            self._open(self.location)
        else:  # a new folder store appears whole, set up, or not at all
            try:
                with made_whole(self.location) as staged:
                    self._open(staged)
                    made, set_up_in = catalog_inode(staged), checks.snapshot_id(self.con)
                    detach(self.con)  # renamed next, then attached again here: its extensions are loaded
            except BaseException:
                self.close()
                raise
            # the store this writer made is set up; one another writer made meanwhile is checked and set up
            if catalog_inode(self.location) == made:
                self._open(self.location, setup=False)
                checks.made(self.con, self.location, set_up_in)
            else:
                self._open(self.location)
        self._stager = Stager(self.con)
        return self

    def _open(self, location: Location, setup: bool = True) -> None:
        try:
            if self.con is None:
                self.con = attach(location, read_only=False, create=True)
            else:
                attach_on(self.con, location, read_only=False)
            self.con.execute(f"USE {STORE}")
            self._attached = location
            if setup:
                self._committed(self._setup, "setup")
        except BaseException:
            self.close()
            raise

    def __exit__(self, kind, value, trace) -> None:
        """Recompute the derived rows of the runs whose files changed (whatever stopped the replay: an
        error, Ctrl-C; only a kill skips it, and the next writer does it), then close."""
        try:
            if self.con is not None:
                self.refresh()
        finally:
            self.close()

    def refresh(self) -> list[str]:
        """Recompute, in one commit, the findings, checks and intervals of every run whose stored files
        differ from those they were computed from; the runs."""
        return self._committed(
            lambda: self._changed(derived.refresh(self.con, self.max_staleness, self.merge)), "derived"
        )

    def _committed(self, work: Callable[[], T], name: str | tuple[str, ...]) -> T:
        """`committed` on this writer's connection; the snapshot its commit made then counts as checked
        (`written`). A work that ends in a `Rollback` commits nothing: the snapshot is then another's."""
        wrote: list[bool] = []

        def tracked() -> T:
            wrote.clear()  # a try that conflicted is run again
            result = work()
            wrote.append(True)
            return result

        result = committed(self.con, tracked, name)
        if wrote:
            checks.written(self.con, self._attached)
        return result

    def _changed(self, result):
        """`result` once the ticket is bumped, or a rollback when the work changed nothing."""
        if not result:
            raise Rollback(result)
        self.con.execute("UPDATE ingest_ticket SET n = n + 1")
        return result

    def _setup(self) -> None:
        """The store set up, or checked (`evaluator.store.setup`), in the transaction of `committed`."""
        self._changed(set_up(self.con, self.location, self.loss, self.sample))

    def digests(self) -> dict[str, str]:
        """The digest of every file already in the store, with the path (or URI) it was recorded under."""
        return dict(self.con.execute("SELECT digest, path FROM ingested_file").fetchall())

    def ingest(
        self,
        path: Path | str,
        digest: str,
        summary: FileSummary,
        sequences: pa.Table,
        evidence: Evidence | None = None,
    ) -> Result:
        """Stage and commit one file (`stage`, then `commit` of it alone): True once committed, False (and
        no change) if its digest is already in the store; `CopyOf` a stored file it re-saves, else a
        `duplicate_across_files` problem, if it repeats a token of a stored file (no change either:
        `evaluator.store.repeats`); the problem of a run_id the store cannot keep."""
        staged = self.stage(path, digest, summary, sequences, evidence)
        return staged if isinstance(staged, Problem) else self.commit([staged])[0]

    def stage(
        self,
        path: Path | str,
        digest: str,
        summary: FileSummary,
        sequences: pa.Table,
        evidence: Evidence | None = None,
    ) -> StagedFile | Problem:
        """Write one file's summaries and token identity (`FileFacts.sequences`) as Parquet files of the
        store (the work that runs beside other writers' commits), to be recorded under `path` (made
        absolute; a str is an object-storage URI, recorded as it is) with its evidence for the findings;
        or the problem of a run_id the store cannot keep (nothing written)."""
        return staged_file(self._stager, recorded_location(path), digest, summary, sequences, evidence)

    def commit(self, files: list[StagedFile]) -> list[Result | duckdb.Error]:
        """Register staged files (`stage`, here or in another process) in one transaction (a group commit:
        `evaluator.store.group`), each file's result as `ingest`'s, in order; checked again if another
        writer commits first. A group whose files share a token, or whose transaction fails (a DuckDB
        error), is committed file by file: the error of a file that fails alone is its result (one file's
        own commit raises it). Staged Parquet files that no commit registered are deleted."""
        start = time.perf_counter()
        if len(files) > 1 and entangled(files):
            self.commit_s += time.perf_counter() - start
            return [r for f in files for r in self.commit([f])]
        con, registered = self.con, set()

        def work() -> list[Result]:
            results = check(con, files, self.db)  # before any is registered (evaluator.store.group)
            passed = [f for f, result in zip(files, results, strict=True) if result is None]
            registered.clear()
            registered.update(f.file_id for f in passed)
            if not passed:
                raise Rollback(results)
            register(con, passed)
            con.execute("UPDATE ingest_ticket SET n = n + 1")
            return [True if r is None else r for r in results]

        results, alone = None, False
        try:
            results = self._committed(work, tuple(f.name for f in files))
        except duckdb.Error:
            alone = len(files) > 1
            if not alone:
                raise
        finally:
            self.commit_s += time.perf_counter() - start
            if results is None and not alone:  # raised: nothing registered
                self.discard(files)
        if alone:  # which file failed: each in a transaction of its own
            return [self._alone(f) for f in files]
        self.discard([f for f in files if f.file_id not in registered])  # not the store's files
        for f in files:
            if f.file_id in registered and self.merge:
                self._merge_later(f)
        return results

    def discard(self, files: list[StagedFile]) -> None:
        """Delete the staged Parquet files of files no commit registers (objects: left to compaction)."""
        for f in files:
            self._stager.discard(f.staged)

    def _alone(self, f: StagedFile) -> Result | duckdb.Error:
        """`f` committed on its own: its result, or the error its commit raised (its files deleted)."""
        try:
            return self.commit([f])[0]
        except duckdb.Error as error:
            return error

    def _merge_later(self, f: StagedFile) -> None:
        """Count a committed file's staleness sketch rows; merge the runs' sketches once they are due."""
        self._unmerged_runs.update(f.sketch_runs)
        self._unmerged_rows += f.sketch_rows
        if self._unmerged_rows >= max(self._merged_rows, MERGE_MIN_ROWS):

            def merge() -> int:
                runs = derived.mergeable(self.con, sorted(self._unmerged_runs))
                if not runs:  # each of one file so far
                    raise Rollback(0)
                return self._changed(derived.merge_sketches(self.con, runs) or -1)

            self._merged_rows, self._unmerged_rows = self._committed(merge, "merge"), 0
            self._unmerged_runs.clear()

    def record_max_staleness(self, value: int, source: str, key: str) -> None:
        """Record the trainer's maximum staleness, where it was read and the config key that sets it
        (`reader.stored_max_staleness`), in a commit of its own; the latest replay that knows it replaces
        it (no commit when the store already holds the same)."""
        entry = json.dumps({"value": int(value), "source": source, "key": key})

        def work() -> None:
            con, key = self.con, literal(MAX_STALENESS_KEY)
            if con.execute(f"SELECT value FROM store_meta WHERE key = {key}").fetchall() == [(entry,)]:
                raise Rollback(None)
            con.execute(f"DELETE FROM store_meta WHERE key = {key}")
            con.execute(f"INSERT INTO store_meta VALUES ({key}, {literal(entry)})")
            self._changed(True)

        self._committed(work, "max_staleness")

    def record_what_if(self, rows: pa.Table) -> None:
        """Record the what-if table of one replay (`evaluator.verdict.what_if`): the rows of the runs it
        judged replace every earlier row of those runs, in one commit."""
        con, runs = self.con, pc.unique(rows["run_id"]).to_pylist()

        def work() -> None:
            con.execute(f"DELETE FROM what_if WHERE list_contains({literal(runs)}, run_id)")
            with arrow_view(con, "judged", rows):
                con.execute("INSERT INTO what_if BY NAME SELECT * FROM judged")
            self._changed(True)

        self._committed(work, "what_if")

    def close(self) -> None:
        if self._stager is not None:  # a cursor of the connection
            self._stager.close()
        if self.con is not None:
            checks.keep(self.con, self._attached)
            self.con.close()
        self.con = self._stager = None
