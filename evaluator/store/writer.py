"""The metrics store (DuckDB): one writer that never blocks a reader, readers that run only proxaudit's SQL.

DuckDB lets one process write a database file or many read it. So a writer here never opens the store
itself: `StoreWriter` takes an exclusive lock (`.DB.lock`, one replay per store), copies the published
store to a private working file (`.DB.work`), ingests files there, each in one transaction that refuses a
repeated token, and publishes by copying the working file beside the store and renaming it over it:
atomic, so a reader sees a whole publish or the one before, and a kill leaves the last publish (the first
creation of a store included). Publishing costs a copy of the store, so it happens after every file
while a copy takes under 50 ms, else after a file once the time since the last copy is ten times what
that copy took; always at the end.

Readers open the published store with `evaluator.store.reader.open_store`.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa

from evaluator.duck import connect
from evaluator.errors import StoreError
from evaluator.formulas.loss import DEFAULT_LOSS, Loss
from evaluator.problems import CheckOutcome, Finding, Problem
from evaluator.sources import recorded_location
from evaluator.store import findings as stored_findings
from evaluator.store.files import publish_copy, sibling, writing
from evaluator.store.intervals import refresh_intervals
from evaluator.store.reader import (
    LOSS_KEY,
    MAX_STALENESS_KEY,
    StoreBusy,
    check_db_path,
    check_store,
    stored_loss,
)
from evaluator.store.repeats import CopyOf, repeats
from schemas.store import METRIC_TABLE, STORE_DDL, STORE_SCHEMA_VERSION

LOCK_WAIT_S = 30.0
CHEAP_PUBLISH_S = 0.05
PUBLISH_SHARE = 0.1
"""Publish after every file while a publish takes under CHEAP_PUBLISH_S (a store of tens of MB); a larger
store after a file when the last publish took at most PUBLISH_SHARE of the time since it."""
CRASH_ENV = "PROXAUDIT_CRASH_BEFORE_COMMIT"
"""Fault injection for tests: when set to a file's name, replay dies (os._exit) after inserting that
file's rows and before committing them, as a kill -9 would."""


@dataclass
class FileSummary:
    """Everything the store keeps of one file, as Arrow tables without `file_id` (what
    `evaluator.replay.summarise` computes)."""

    n_rows: int
    n_tokens: int
    file_tokens: pa.Table  # run_id, step, staleness, n_tokens, n_prox
    moments: pa.Table  # run_id, step, staleness, method, metric, n, sum, sum_sq, min, max
    sketch_by_step: pa.Table  # run_id, step, method, metric, bucket, count
    sketch_by_staleness: pa.Table  # run_id, staleness, method, metric, bucket, count


_INSERTS = {
    "file_tokens": "SELECT {fid}, run_id, step, staleness, sum(n_tokens), sum(n_prox) FROM part "
    "GROUP BY run_id, step, staleness ORDER BY run_id, step, staleness",
    "metric_moments": "SELECT {fid}, run_id, step, staleness, method, metric, sum(n), sum(sum), sum(sum_sq), "
    "min(min), max(max) FROM part GROUP BY ALL ORDER BY run_id, method, metric, step, staleness",
    "sketch_by_step": "SELECT {fid}, run_id, step, method, metric, bucket, sum(count) FROM part "
    "GROUP BY ALL ORDER BY run_id, method, metric, step, bucket",
    "sketch_by_staleness": "SELECT run_id, staleness, method, metric, bucket, sum(count) FROM part "
    "GROUP BY ALL ORDER BY run_id, method, metric, staleness, bucket",
}
# The staleness sketches of every file merged into one row per bucket (counts add exactly), so that the
# table, which run-level quantiles and the gate read, stays as small as one run's sketch.
_MERGED_STALENESS_SKETCHES = """
    CREATE TEMP TABLE merged AS
        SELECT run_id, staleness, method, metric, bucket, sum(count)::BIGINT AS count FROM sketch_by_staleness
        GROUP BY ALL ORDER BY run_id, method, metric, staleness, bucket"""


class StoreWriter:
    """The one writer of a store, as a context manager (see the module docstring): `digests`, `ingest`,
    `publish`. `loss` is recorded with the first replay; a store made under another loss is refused."""

    def __init__(self, db: str | os.PathLike, loss: Loss = DEFAULT_LOSS) -> None:
        self.db, self.loss = check_db_path(db), loss
        self.work = sibling(self.db, "work")
        self.con: duckdb.DuckDBPyConnection | None = None
        self._lock = None
        self._published_at, self._publish_s, self._dirty = 0.0, 0.0, False
        self._merged_rows = self._unmerged_rows = 0  # staleness sketch rows at the last merge, and since

    def __enter__(self) -> StoreWriter:
        with writing(self.db, "cannot write a store there"):
            self.db.parent.mkdir(parents=True, exist_ok=True)
            self._lock = open(sibling(self.db, "lock"), "a+b")
        self._take_lock()
        try:
            with writing(self.db, "cannot write a store there"):
                self._open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind, value, trace) -> None:
        """Publish what was ingested (the working copy is consistent whatever stopped the replay: an
        error, Ctrl-C), then let go. Only a kill skips this, leaving the last publish."""
        try:
            if self._dirty and self.con is not None:
                self.publish(final=True)
        finally:
            self.close()

    def _take_lock(self) -> None:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise StoreBusy(f"{self.db}: another replay is writing this store") from None
                time.sleep(0.1)

    def _open(self) -> None:
        """The working copy: the published store (checked), or an empty new one; then the DDL and loss."""
        staged = self.db.parent.glob(f".{self.db.name}.publish-*")
        for stale in (self.work, self.work.with_name(self.work.name + ".wal"), *staged):
            stale.unlink(missing_ok=True)  # left by a killed replay: the published store is the truth
        fresh = not self.db.exists()
        if not fresh:
            with connect(str(self.db), read_only=True) as probe:
                empty = not probe.execute(
                    "SELECT count(*) FROM duckdb_tables() WHERE NOT temporary"
                ).fetchone()[0]
                empty = (
                    empty
                    and not probe.execute(
                        "SELECT count(*) FROM duckdb_views() WHERE NOT internal"
                    ).fetchone()[0]
                )
                if not empty:
                    check_store(probe, self.db)
            shutil.copyfile(self.db, self.work)
            wal = self.db.with_name(self.db.name + ".wal")
            if wal.exists():  # written by another program: replayed when the copy is opened
                shutil.copyfile(wal, self.work.with_name(self.work.name + ".wal"))
        self.con = connect(str(self.work))
        self.con.execute(STORE_DDL)
        self.con.execute(
            "INSERT INTO store_meta VALUES ('store_schema_version', ?) ON CONFLICT DO NOTHING",
            [STORE_SCHEMA_VERSION],
        )
        self.con.execute("DELETE FROM metric_definition")
        self.con.executemany(
            "INSERT INTO metric_definition VALUES (?, ?, ?, ?, ?, ?)",
            [[m.name, m.formula, m.needs_truth, m.of, m.per, m.binary] for m in METRIC_TABLE],
        )
        recorded = stored_loss(self.con)
        if recorded is None:
            self.con.execute(
                "INSERT INTO store_meta VALUES (?, ?)", [LOSS_KEY, json.dumps(self.loss.to_dict())]
            )
        elif recorded != self.loss:
            raise StoreError(
                f"{self.db} holds metrics computed under the loss {recorded.describe()}; this replay "
                f"asks for {self.loss.describe()}. One store holds one loss: replay under the same loss, "
                "or into another database"
            )
        self._dirty = fresh or recorded is None  # a new store is published even if no file makes it in
        (self._merged_rows,) = self.con.execute("SELECT count(*) FROM sketch_by_staleness").fetchone()

    @property
    def unpublished(self) -> bool:
        """Something was ingested (or the store created) since the last publish."""
        return self._dirty

    def digests(self) -> dict[str, str]:
        """The digest of every file already in the store, with the path (or URI) it was recorded under."""
        return dict(self.con.execute("SELECT digest, path FROM ingested_file").fetchall())

    def ingest(
        self, path: Path | str, digest: str, summary: FileSummary, sequences: pa.Table
    ) -> bool | Problem | CopyOf:
        """Insert one file's summaries and token identity (`FileFacts.sequences`) in a single transaction,
        recorded under `path` (made absolute; a str is an object-storage URI, recorded as it is).
        False (and no change) if its digest is already in the store; `CopyOf` a stored file it re-saves,
        else a `duplicate_across_files` problem, if it repeats a token of a stored file (no change either:
        `evaluator.store.repeats`). Published when it is cheap enough."""
        con = self.con
        con.register("part_sequences", sequences)
        con.execute("BEGIN TRANSACTION")
        try:
            if con.execute("SELECT 1 FROM ingested_file WHERE digest = ?", [digest]).fetchall():
                con.execute("ROLLBACK")
                return False
            repeated = repeats(con, summary)
            if repeated is not None:  # a duplicate_across_files problem, or a re-saved copy
                con.execute("ROLLBACK")
                return repeated
            location = recorded_location(path)
            self._insert(location, digest, summary)
            if os.environ.get(CRASH_ENV) == location.rsplit("/", 1)[-1]:
                os._exit(70)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")  # a failed insert leaves nothing of the file
            raise
        finally:
            con.unregister("part_sequences")
        self._dirty = True
        since = time.monotonic() - self._published_at
        if self._publish_s < CHEAP_PUBLISH_S or since >= self._publish_s / PUBLISH_SHARE:
            self.publish()
        return True

    def record_findings(self, findings: Sequence[Finding], checks: Sequence[CheckOutcome] = ()) -> None:
        """Store the warnings of one replay about runs the store holds (one row per run and rule: a
        rule that fires again replaces its row; one that does not keeps the row of earlier files), and
        what every check made of those runs (`evaluator.store.findings`)."""
        if stored_findings.record(self.con, findings, checks):
            self._dirty = True

    def record_max_staleness(self, value: int, source: str, key: str) -> None:
        """Record the trainer's maximum staleness, where it was read and the config key that sets it
        (`reader.stored_max_staleness`); the latest replay that knows it replaces it."""
        entry = json.dumps({"value": int(value), "source": source, "key": key})
        self.con.execute("INSERT OR REPLACE INTO store_meta VALUES (?, ?)", [MAX_STALENESS_KEY, entry])
        self._dirty = True

    def record_what_if(self, rows: pa.Table) -> None:
        """Record the what-if table of one replay (`evaluator.verdict.what_if`): the rows of the runs it
        judged replace every earlier row of those runs, in one transaction."""
        con = self.con
        con.register("judged", rows)
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute("DELETE FROM what_if WHERE run_id IN (SELECT run_id FROM judged)")
            con.execute("INSERT INTO what_if BY NAME SELECT * FROM judged")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        finally:
            con.unregister("judged")
        self._dirty = True

    def _insert(self, location: str, digest: str, summary: FileSummary) -> None:
        con = self.con
        file_id = con.execute("SELECT coalesce(max(file_id), 0) + 1 FROM ingested_file").fetchone()[0]
        con.execute(
            "INSERT INTO ingested_file VALUES (?, ?, ?, ?, ?, now())",
            [file_id, digest, location, summary.n_rows, summary.n_tokens],
        )
        con.execute(
            f"INSERT INTO file_sequences SELECT {int(file_id)}, run_id, seq_id, minibatch, pos_min, pos_max "
            "FROM part_sequences ORDER BY run_id, seq_id, minibatch"
        )
        tables = {
            "file_tokens": summary.file_tokens,
            "metric_moments": summary.moments,
            "sketch_by_step": summary.sketch_by_step,
            "sketch_by_staleness": summary.sketch_by_staleness,
        }
        self._unmerged_rows += summary.sketch_by_staleness.num_rows
        for table, part in tables.items():
            con.register("part", part)
            con.execute(f"INSERT INTO {table} " + _INSERTS[table].format(fid=int(file_id)))
            con.unregister("part")

    def publish(self, final: bool = False) -> None:
        """Make the working copy the store: merge the staleness sketches (at the end of a replay, and
        whenever the rows added since the last merge outnumber the merged ones, so merging costs O(1) per
        row and a reader never scans more than twice the merged table), checkpoint, and publish a copy
        atomically (`evaluator.store.files.publish_copy`)."""
        started = time.monotonic()
        if self._unmerged_rows and (final or self._unmerged_rows >= self._merged_rows):
            self._merged_rows, self._unmerged_rows = self._merge_staleness_sketches(), 0
        refresh_intervals(self.con)
        self.con.execute("CHECKPOINT")
        with writing(self.db, "cannot publish the store"):
            publish_copy(self.work, self.db)
        self._published_at, self._publish_s = time.monotonic(), time.monotonic() - started
        self._dirty = False

    def _merge_staleness_sketches(self) -> int:
        """Merge the staleness sketches into one row per bucket, in one transaction, when files share
        buckets (a rewrite that merges nothing would only grow the file); the rows left."""
        con = self.con
        con.execute(f"BEGIN TRANSACTION; {_MERGED_STALENESS_SKETCHES}")
        try:
            rows, keys = con.execute(
                "SELECT (SELECT count(*) FROM sketch_by_staleness), (SELECT count(*) FROM merged)"
            ).fetchone()
            if keys < rows:
                con.execute(
                    "DELETE FROM sketch_by_staleness; INSERT INTO sketch_by_staleness SELECT * FROM merged"
                )
            con.execute("DROP TABLE merged; COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        return keys

    def close(self) -> None:
        """Close the working copy, remove it and let go of the lock (published or not)."""
        if self.con is not None:
            self.con.close()
            self.con = None
        for leftover in (self.work, self.work.with_name(self.work.name + ".wal")):
            leftover.unlink(missing_ok=True)
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None
