"""A writer of the metrics store (a DuckLake: `evaluator.store.lake`): any number at once, on one machine or
several, never blocking a reader.

Each file is ingested in one transaction, committed as one snapshot of new Parquet files, written before the
transaction (`evaluator.store.staging`) and registered by it: its cost is the file's rows, not the
store's, and the serial part is small. A reader sees the file whole or not at all. A DuckLake has no unique
constraints, so the rules "each file ingested once" (by its digest) and "a token stored at most once" are
checked inside the transaction, which also bumps the one row of `ingest_ticket`: two writers that ingest
at once conflict, the second's commit fails and `evaluator.store.commits.committed` runs it again on the
newer snapshot, where it finds the first's file. What is judged on a whole run (findings, checks,
intervals) is recomputed from the stored per-file rows when a writer closes (`evaluator.store.derived`).
A kill at any point leaves the store as of its last commit; the next replay finishes the work.

Readers open the store with `evaluator.store.reader.open_store`.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from evaluator.errors import StoreError
from evaluator.formulas.loss import DEFAULT_LOSS, Loss
from evaluator.problems import Problem
from evaluator.sources import recorded_location
from evaluator.store import derived
from evaluator.store.checks import check_store
from evaluator.store.commits import Rollback, committed
from evaluator.store.evidence import evidence_rows
from evaluator.store.lake import (
    STORE,
    Location,
    attach,
    attach_on,
    catalog_inode,
    detach,
    locate,
    made_whole,
    quote,
)
from evaluator.store.reader import LOSS_KEY, MAX_STALENESS_KEY, SAMPLE_KEY, stored_loss, stored_sample
from evaluator.store.repeats import CopyOf, repeats
from evaluator.store.staging import FileSummary, Stager, record_name_maps, unstorable_text
from evaluator.validate.evidence import Evidence
from schemas.store import METRIC_TABLE, STORE_SCHEMA_VERSION, TABLE_DDL, VIEWS_DDL

MERGE_MIN_ROWS = 1 << 20
"""A writer merges the staleness sketches of the runs it wrote (`evaluator.store.derived.merge_sketches`)
once the rows it added since the last merge outnumber the merged ones and this many: merging costs O(1)
per row, and a reader never scans much more than a merged sketch."""
DDL_KEY = "ddl"
"""The `store_meta` key of the digest of the views and metric definitions the store carries."""


def file_id_of(digest: str) -> int:
    """A file's id: the first 60 bits of its digest, the same in every store whatever the order of ingest."""
    return int(digest[:15], 16)


def _ddl_digest() -> str:
    definitions = json.dumps([list(vars(m).values()) for m in METRIC_TABLE])
    return hashlib.blake2b((VIEWS_DDL + definitions).encode(), digest_size=16).hexdigest()


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
    ) -> None:
        self.location = locate(db, data_path)
        self.db = self.location.given
        self.loss, self.max_staleness, self.sample = loss, max_staleness, float(sample)
        self.con: duckdb.DuckDBPyConnection | None = None
        self._stager: Stager | None = None
        self._committed = False
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
                    made = catalog_inode(staged)
                    detach(self.con)  # renamed next, then attached again here: its extensions are loaded
            except BaseException:
                self.close()
                raise
            # the store this writer made is set up; one another writer made meanwhile is checked and set up
            self._open(self.location, setup=catalog_inode(self.location) != made)
        self._stager = Stager(self.con)
        return self

    def _open(self, location: Location, setup: bool = True) -> None:
        try:
            if self.con is None:
                self.con = attach(location, read_only=False, create=True)
            else:
                attach_on(self.con, location, read_only=False)
            self.con.execute(f"USE {STORE}")
            if setup:
                committed(self.con, self._setup, "setup")
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
        return committed(
            self.con, lambda: self._changed(derived.refresh(self.con, self.max_staleness)), "derived"
        )

    def _changed(self, result):
        """`result` once the ticket is bumped, or a rollback when the work changed nothing."""
        if not result:
            raise Rollback(result)
        self.con.execute("UPDATE ingest_ticket SET n = n + 1")
        return result

    def _setup(self) -> None:
        """The tables on a new store (else a check that it is a proxaudit store of this version), the
        views and metric definitions when they changed, the loss and sampling fraction."""
        con, changed = self.con, False
        fresh = not con.execute(
            "SELECT 1 FROM duckdb_tables() WHERE database_name = ? AND table_name = 'store_meta'", [STORE]
        ).fetchall()
        if fresh:
            con.execute(TABLE_DDL)
            con.execute("INSERT INTO store_meta VALUES ('store_schema_version', ?)", [STORE_SCHEMA_VERSION])
            con.execute("INSERT INTO ingest_ticket VALUES (0)")
            changed = True
        else:
            check_store(con, self.location, STORE)  # a crafted store is refused before anything is written
        changed |= record_name_maps(con, fresh)
        digest = _ddl_digest()
        if con.execute("SELECT value FROM store_meta WHERE key = ?", [DDL_KEY]).fetchall() != [(digest,)]:
            con.execute(VIEWS_DDL)
            con.execute("DELETE FROM metric_definition")
            con.executemany(
                "INSERT INTO metric_definition VALUES (?, ?, ?, ?, ?, ?)",
                [[m.name, m.formula, m.needs_truth, m.of, m.per, m.binary] for m in METRIC_TABLE],
            )
            con.execute("DELETE FROM store_meta WHERE key = ?", [DDL_KEY])
            con.execute("INSERT INTO store_meta VALUES (?, ?)", [DDL_KEY, digest])
            changed = True
        changed |= self._record(LOSS_KEY, stored_loss(con), self.loss, json.dumps(self.loss.to_dict()))
        changed |= self._record(SAMPLE_KEY, stored_sample(con), self.sample, repr(self.sample))
        self._changed(changed)

    def _record(self, key: str, recorded, wanted, text: str) -> bool:
        """Record `wanted` under `key` on a store without one (True), or refuse a store made with another."""
        if recorded is None:
            self.con.execute("INSERT INTO store_meta VALUES (?, ?)", [key, text])
            return True
        if recorded != wanted:
            what = {LOSS_KEY: "the loss", SAMPLE_KEY: "--sample-sequences"}[key]
            said = (recorded.describe(), wanted.describe()) if key == LOSS_KEY else (recorded, wanted)
            raise StoreError(
                f"{self.db} holds metrics computed under {what} {said[0]}; this replay asks for {said[1]}. "
                f"One store holds one {what.removeprefix('the ')}: replay under the same, or into another "
                "store"
            )
        return False

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
    ) -> bool | Problem | CopyOf:
        """Insert one file's summaries, token identity (`FileFacts.sequences`) and evidence for the
        findings in a single commit, recorded under `path` (made absolute; a str is an object-storage URI,
        recorded as it is). False (and no change) if its digest is already in the store; `CopyOf` a stored
        file it re-saves, else a `duplicate_across_files` problem, if it repeats a token of a stored file
        (no change either: `evaluator.store.repeats`). Both are checked again if another writer commits
        first."""
        location = recorded_location(path)
        file_id = file_id_of(digest)
        con = self.con
        unstorable = unstorable_text(summary)
        if unstorable is not None:
            return unstorable

        def work() -> bool | Problem | CopyOf:
            self._committed = False
            stored = con.execute("SELECT digest FROM ingested_file WHERE file_id = ?", [file_id]).fetchall()
            if stored and stored[0][0] == digest:
                raise Rollback(False)
            if stored:
                raise StoreError(f"{self.db}: two files share the id {file_id} ({digest}, {stored[0][0]})")
            repeated = repeats(con, summary)
            if repeated is not None:  # a duplicate_across_files problem, or a re-saved copy
                raise Rollback(repeated)
            self._insert(location, file_id, digest, summary, evidence, staged)
            con.execute("UPDATE ingest_ticket SET n = n + 1")
            self._committed = True
            return True

        def merge() -> int:
            return self._changed(derived.merge_sketches(con, sorted(self._unmerged_runs)) or -1)

        staged = self._stager.stage(file_id, summary, sequences)
        con.register("part_sequences", sequences)
        start = time.perf_counter()
        try:
            result = committed(con, work, location.rsplit("/", 1)[-1])
        finally:
            self.commit_s += time.perf_counter() - start
            con.unregister("part_sequences")
            if self._committed is not True:  # nothing registered them: not the store's files
                self._stager.discard(staged)
        if result is True:
            self._unmerged_runs.update(pc.unique(summary.sketch_by_staleness["run_id"]).to_pylist())
            self._unmerged_rows += summary.sketch_by_staleness.num_rows
            if self._unmerged_rows >= max(self._merged_rows, MERGE_MIN_ROWS):
                self._merged_rows, self._unmerged_rows = committed(con, merge, "merge"), 0
                self._unmerged_runs.clear()
        return result

    def record_max_staleness(self, value: int, source: str, key: str) -> None:
        """Record the trainer's maximum staleness, where it was read and the config key that sets it
        (`reader.stored_max_staleness`), in a commit of its own; the latest replay that knows it replaces
        it (no commit when the store already holds the same)."""
        entry = json.dumps({"value": int(value), "source": source, "key": key})

        def work() -> None:
            con, key = self.con, MAX_STALENESS_KEY
            if con.execute("SELECT value FROM store_meta WHERE key = ?", [key]).fetchall() == [(entry,)]:
                raise Rollback(None)
            con.execute("DELETE FROM store_meta WHERE key = ?", [key])
            con.execute("INSERT INTO store_meta VALUES (?, ?)", [key, entry])
            self._changed(True)

        committed(self.con, work, "max_staleness")

    def record_what_if(self, rows: pa.Table) -> None:
        """Record the what-if table of one replay (`evaluator.verdict.what_if`): the rows of the runs it
        judged replace every earlier row of those runs, in one commit."""
        con = self.con

        def work() -> None:
            con.execute("DELETE FROM what_if WHERE run_id IN (SELECT DISTINCT run_id FROM judged)")
            con.execute("INSERT INTO what_if BY NAME SELECT * FROM judged")
            self._changed(True)

        con.register("judged", rows)
        try:
            committed(con, work, "what_if")
        finally:
            con.unregister("judged")

    def _insert(
        self,
        location: str,
        file_id: int,
        digest: str,
        summary: FileSummary,
        evidence: Evidence | None,
        staged: dict[str, str],
    ) -> None:
        con = self.con
        con.execute(
            "INSERT INTO ingested_file VALUES (?, ?, ?, ?, ?, now())",
            [file_id, digest, location, summary.n_rows, summary.n_tokens],
        )
        for table, target in staged.items():
            con.execute(f"CALL ducklake_add_data_files('{STORE}', '{table}', '{quote(target)}')")
        if evidence is not None:
            con.register("part", evidence_rows(file_id, evidence))
            con.execute("INSERT INTO file_evidence SELECT * FROM part")
            con.unregister("part")

    def close(self) -> None:
        if self._stager is not None:  # a cursor of the connection
            self._stager.close()
        if self.con is not None:
            self.con.close()
        self.con = self._stager = None


_WORKER_WRITERS: dict[tuple, StoreWriter] = {}


def worker_writer(db: str, loss: Loss, sample: float, max_staleness: int | None) -> StoreWriter:
    """The writer a worker process (a Ray worker) commits its files with, opened once per process and
    store and kept (the process's end closes it); the replay that handed out the files computes the
    derived rows when it closes its own."""
    key = (db, json.dumps(loss.to_dict()), sample, max_staleness)
    if key not in _WORKER_WRITERS:
        _WORKER_WRITERS[key] = StoreWriter(db, loss, max_staleness=max_staleness, sample=sample).__enter__()
    return _WORKER_WRITERS[key]
