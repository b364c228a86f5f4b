"""Keeping a store (`proxaudit store ...`): compaction of the many small Parquet files each file's commit
makes, and the conversion of a single-file store of an earlier proxaudit (store schema version 5 or 6)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb

from evaluator.duck import connect, literal
from evaluator.errors import StoreError
from evaluator.formulas.loss import Loss
from evaluator.formulas.sketch import COARSE, COARSE_BITS
from evaluator.store import derived
from evaluator.store.checks import written
from evaluator.store.commits import Rollback, committed
from evaluator.store.lake import DUCKDB_MAGIC, STORE, attach, locate, stored_data_path
from evaluator.store.reader import LOSS_KEY, MAX_STALENESS_KEY
from evaluator.store.writer import StoreWriter
from schemas.store import METRICS

ORPHAN_AGE_H = 1.0
"""Data files no snapshot references are deleted once this old (a younger one may be a writer's commit in
flight)."""
CONVERTED_VERSIONS = ("5", "6")
"""The single-file stores `convert` reads: the last two before the DuckLake (6 added the newer losses'
metrics; 5 lacks them, and holds one this proxaudit no longer computes: `is_weight_clamped`)."""


@dataclass
class Compaction:
    """What `compact` did: data files before and after, snapshots expired."""

    files_before: int
    files_after: int
    snapshots_expired: int

    def line(self) -> str:
        return (
            f"{self.files_before:,} data files -> {self.files_after:,}; "
            f"{self.snapshots_expired:,} snapshots expired"
        )


def _data_files(con: duckdb.DuckDBPyConnection) -> int:
    """The Parquet files the latest snapshot reads: data files and delete files."""
    meta = f"__ducklake_metadata_{STORE}"
    return con.execute(
        f"SELECT (SELECT count(*) FROM {meta}.ducklake_data_file WHERE end_snapshot IS NULL) + "
        f"(SELECT count(*) FROM {meta}.ducklake_delete_file WHERE end_snapshot IS NULL)"
    ).fetchone()[0]


def compact(
    db: str | os.PathLike, expire_older_than_h: float | None = None, orphan_age_h: float = ORPHAN_AGE_H
) -> Compaction:
    """Merge the store's small data files (and the rows inlined in its catalog) into larger ones, each
    change one commit that readers see whole; with `expire_older_than_h`, forget snapshots older than that
    (time travel before them ends) and delete the files only they used. Data files of killed commits are
    deleted once `orphan_age_h` old. Safe while replays write: a conflicting step is run again."""
    con = attach(locate(db), read_only=False)
    try:
        before = _data_files(con)
        committed(
            con, lambda: con.execute(f"CALL ducklake_flush_inlined_data('{STORE}')").fetchall(), "flush"
        )
        committed(
            con, lambda: con.execute(f"CALL ducklake_merge_adjacent_files('{STORE}')").fetchall(), "merge"
        )
        expired = 0
        if expire_older_than_h is not None:
            (expired,) = con.execute(
                f"SELECT count(*) FROM ducklake_expire_snapshots('{STORE}', older_than => now() - "
                f"to_microseconds({literal(int(expire_older_than_h * 3600e6))}))"
            ).fetchone()
        con.execute(f"SELECT count(*) FROM ducklake_cleanup_old_files('{STORE}', cleanup_all => true)")
        con.execute(
            f"SELECT count(*) FROM ducklake_delete_orphaned_files('{STORE}', older_than => now() - "
            f"to_microseconds({literal(int(orphan_age_h * 3600e6))}))"
        )
        _delete_unregistered(con, orphan_age_h)
        return Compaction(before, _data_files(con), expired)
    finally:
        con.close()


WATCHED_TABLES = ("file_tokens", "file_evidence", "file_sequences", "metric_moments")
"""The per-file tables each of watch's looks reads whole (to find stale runs, the run's findings, repeated
tokens, the intervals and the verdict): one Parquet file per ingested file unless merged."""


def merge_run_sketches(db: str | os.PathLike, grown: bool = False) -> list[str]:
    """Merge the staleness sketches of every run of the store at `db` whose rows come from more than one
    file (`evaluator.store.derived.merge_sketches`), in one commit: what a replay with `merge=False` left
    (`watch` raises its alerts first; readers add up a run's rows over its files either way). With `grown`,
    only the runs whose rows not merged yet are at least as many as their merged ones (`derived.mergeable`):
    what `watch` does while the run goes on, so that a look late in a long run does not rewrite the run's
    whole sketch for one file's rows. The runs merged."""
    location = locate(db)
    con = attach(location, read_only=False)
    try:
        con.execute(f"USE {STORE}")

        def work() -> list[str]:
            runs = derived.mergeable(con, grown=grown)
            if not runs:
                raise Rollback([])
            derived.merge_sketches(con, runs)
            con.execute("UPDATE ingest_ticket SET n = n + 1")  # conflicts with another writer's commit
            return runs

        runs = committed(con, work, "merge")
        if runs:
            written(con, location)
        return runs
    finally:
        con.close()


def merge_small_files(db: str | os.PathLike, tables: tuple[str, ...] = WATCHED_TABLES) -> int:
    """Merge the small data files of `tables` (DuckLake's `ducklake_merge_adjacent_files`), a commit per
    table that readers see whole; snapshots are kept (time travel goes on) and no file is deleted (that is
    `compact`'s). The tables merged. Without it a reader of such a table opens one Parquet file per
    ingested file: a look of `watch` late in a long run spent seconds doing so."""
    location = locate(db)
    con = attach(location, read_only=False)
    try:
        merged = 0
        for table in tables:

            def work(table: str = table) -> list:
                return con.execute(f"CALL ducklake_merge_adjacent_files('{STORE}', '{table}')").fetchall()

            if committed(con, work, f"merge {table}"):  # else no commit: the latest snapshot is another's
                merged += 1
                written(con, location)  # the same rows in fewer files
        return merged
    finally:
        con.close()


def _delete_unregistered(con: duckdb.DuckDBPyConnection, age_h: float) -> None:
    """Delete the staged files (`evaluator.store.staging`) of a local data path that no snapshot registers
    any more (merged away and expired, or of a killed writer) once `age_h` old: DuckLake's own clean-up
    leaves files it did not write. On object storage they are left (a lifecycle rule can expire them)."""
    data = stored_data_path(con)
    if "://" in data:
        return
    known = {
        p
        for (p,) in con.execute(f"SELECT path FROM __ducklake_metadata_{STORE}.ducklake_data_file").fetchall()
    }
    cutoff = time.time() - age_h * 3600
    for staged in Path(data).rglob("proxaudit-*.parquet"):
        if staged.name not in known and staged.stat().st_mtime <= cutoff:
            staged.unlink(missing_ok=True)


_COPIES = {
    "ingested_file": "SELECT {fid}, digest, path, n_rows, n_tokens, ingested_at FROM old.ingested_file o",
    "file_sequences": "SELECT {fid}, run_id, seq_id, minibatch, pos_min, pos_max "
    "FROM old.file_sequences o {join}",
    "file_tokens": "SELECT {fid}, run_id, step, staleness, o.n_tokens, n_prox FROM old.file_tokens o {join}",
    "metric_moments": "SELECT {fid}, run_id, step, staleness, method, metric, n, sum, sum_sq, min, max "
    "FROM old.metric_moments o {join} WHERE {known}",
    "sketch_by_step": "SELECT {fid}, run_id, step, method, metric, {bucket}, sum(count) "
    "FROM old.sketch_by_step o {join} WHERE {known} GROUP BY ALL",
    "sketch_by_staleness": "SELECT 0, run_id, staleness, method, metric, {bucket}, sum(count) "
    "FROM old.sketch_by_staleness WHERE {known} GROUP BY ALL",
    "run_finding": "SELECT run_id, rule, column_name, n_rows, message, found_at, figure, threshold, "
    "examples, advice FROM old.run_finding",
    "run_check": "SELECT run_id, check_name, status, why, checked_at FROM old.run_check",
}
"""What `convert` copies: every file keeps its rows under its new id (from its digest), of the metrics this
proxaudit computes; the old store had merged its staleness sketches over files, so they come as file 0. Its
sketches kept fine buckets throughout: from 2^8 on, eight make one bucket now (`evaluator.formulas.sketch`),
exactly, since each bucket is a union of fine ones."""
_BUCKET = (
    f"(sign(bucket) * CASE WHEN abs(bucket) < {COARSE} THEN abs(bucket) "
    f"ELSE {COARSE} + ((abs(bucket) - {COARSE}) >> {COARSE_BITS}) END)::INTEGER"
)
_JOIN = "JOIN old.ingested_file f USING (file_id)"
_KNOWN = f"metric IN ({', '.join(map(repr, METRICS))})"


def convert(old: str | os.PathLike, new: str | os.PathLike, data_path: str | None = None) -> int:
    """Copy a single-file store of store schema version 5 or 6 into a new store at `new` (made; it must
    not hold a store yet), in one commit; the number of files it holds. Its findings are kept as they were
    (it kept no per-file evidence to judge them again), and so is the trainer's maximum staleness it
    recorded; its intervals are recomputed. The rows of a metric this proxaudit no longer computes are
    left out; the metrics a version-5 store lacks (verl's truncated IS weights and sequence statistics,
    `seq_drift`) stay empty until the token logs are replayed into a new store."""
    old_path = Path(old)
    if not old_path.is_file() or old_path.read_bytes()[8:12] != DUCKDB_MAGIC:
        raise StoreError(f"{old}: not a single-file proxaudit store (a DuckDB database file)")
    if locate(new).exists():
        raise StoreError(f"{new}: already holds a store; convert into a new folder")
    with connect(str(old_path), read_only=True) as probe:
        meta = dict(probe.execute("SELECT key, value FROM store_meta").fetchall())
    if meta.get("store_schema_version") not in CONVERTED_VERSIONS:
        raise StoreError(
            f"{old}: store schema version {meta.get('store_schema_version')!r}; `convert` reads versions "
            f"{' and '.join(CONVERTED_VERSIONS)}: replay the token logs into a new store instead"
        )
    loss = Loss.from_dict(json.loads(meta[LOSS_KEY]))
    with StoreWriter(new, loss, data_path=data_path) as writer:
        con = writer.con
        con.execute(f"ATTACH {literal(str(old_path.absolute()))} AS old (READ_ONLY)")

        def copy() -> int:
            for table, sql in _COPIES.items():
                digest = "o.digest" if table == "ingested_file" else "f.digest"
                fid = f"('0x' || left({digest}, 15))::UBIGINT::BIGINT"  # evaluator.store.group.file_id_of
                parts = {"fid": fid, "join": _JOIN, "known": _KNOWN, "bucket": _BUCKET}
                con.execute(f"INSERT INTO {table} " + sql.format(**parts))
            if MAX_STALENESS_KEY in meta:  # the trainer's maximum staleness, for the gate
                limit = meta[MAX_STALENESS_KEY]
                con.execute(f"INSERT INTO store_meta VALUES ({literal(MAX_STALENESS_KEY)}, {literal(limit)})")
            con.execute("UPDATE ingest_ticket SET n = n + 1")
            return con.execute("SELECT count(*) FROM ingested_file").fetchone()[0]

        n_files = committed(con, copy, "convert")
        con.execute("DETACH old")
    return n_files
