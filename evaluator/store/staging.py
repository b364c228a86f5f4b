"""A file's rows as Parquet files of the store's tables, written before its commit (`Stager`): the commit then
only registers them (`ducklake_add_data_files`), so the part of an ingest that is one at a time per store
does not grow with the file's rows, and the writing runs in parallel with other writers' commits. Files a
commit did not register (the file was stored meanwhile) are deleted; those of a killed writer are
orphans that `proxaudit store compact` deletes."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from evaluator.duck import arrow_view, literal, on_one_thread
from evaluator.problems import Problem
from evaluator.store.checks import expected_tables
from evaluator.store.lake import STORE, stored_data_path


@dataclass
class FileSummary:
    """Everything the store keeps of one file's metrics, as Arrow tables without `file_id` (what
    `evaluator.replay.summarise` computes)."""

    n_rows: int
    n_tokens: int
    file_tokens: pa.Table  # run_id, step, staleness, n_tokens, n_prox
    moments: pa.Table  # run_id, step, staleness, method, metric, n, sum, sum_sq, min, max
    # the sketches: one row per key, sorted by it (staged as they are)
    sketch_by_step: pa.Table  # run_id, step, method, metric, bucket, count
    sketch_by_staleness: pa.Table  # run_id, staleness, method, metric, bucket, count


def unstorable_text(summary: FileSummary) -> Problem | None:
    """The problem of a file whose run_id holds a NUL byte: DuckLake writes a registered file's text
    statistics into its catalog's SQL, where a NUL ends the text (every later query of the table fails)."""
    runs = pc.unique(summary.file_tokens["run_id"]).to_pylist()
    if not any("\x00" in run for run in runs):
        return None
    message = "a run_id holds a NUL byte (\\x00), which the store cannot keep: name the run without one"
    return Problem("unstorable_text", "run_id", summary.n_rows, message)


_SEQUENCES = (
    "SELECT {fid}, run_id, seq_id, minibatch, pos_min, pos_max FROM part ORDER BY run_id, seq_id, minibatch"
)
_INSERTS = {
    "file_tokens": "SELECT {fid}, run_id, step, staleness, sum(n_tokens), sum(n_prox) FROM part "
    "GROUP BY run_id, step, staleness ORDER BY run_id, step, staleness",
    "metric_moments": "SELECT {fid}, run_id, step, staleness, method, metric, sum(n), sum(sum), sum(sum_sq), "
    "min(min), max(max) FROM part GROUP BY ALL ORDER BY run_id, method, metric, step, staleness",
    # one row per key and sorted already (`evaluator.replay.summarise`)
    "sketch_by_step": "SELECT {fid}, run_id, step, method, metric, bucket, count FROM part",
    "sketch_by_staleness": "SELECT {fid}, run_id, staleness, method, metric, bucket, count FROM part",
}


STAGED_TABLES = ("file_sequences", *_INSERTS)
"""The tables whose rows an ingest stages (registered with `ducklake_add_data_files`)."""


class Stager:
    """Writes the per-file tables' Parquet files under the store's data path (a folder or an s3:// prefix,
    ending in a separator) through a cursor of `con`, the writer's connection with the store attached (its
    DuckDB, its extensions and S3 secret; a cursor is a connection of its own, outside the writer's
    transaction)."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.data = stored_data_path(con)
        self.con = con.cursor()

    def stage(self, file_id: int, summary: FileSummary, sequences: pa.Table) -> dict[str, str]:
        """One Parquet file per per-file table, its columns of the store's types: {table: file}."""
        parts = {
            "file_sequences": (sequences, _SEQUENCES),
            "file_tokens": (summary.file_tokens, _INSERTS["file_tokens"]),
            "metric_moments": (summary.moments, _INSERTS["metric_moments"]),
            "sketch_by_step": (summary.sketch_by_step, _INSERTS["sketch_by_step"]),
            "sketch_by_staleness": (summary.sketch_by_staleness, _INSERTS["sketch_by_staleness"]),
        }
        staged = {}
        # One thread (the writer's connection waits for the staging anyway): a COPY of rows in order on
        # several threads holds the rows the faster thread wrote ahead until the slower one's are written. On
        # a busy machine (beside watch's benchmark) a late file of that benchmark (1.9M sketch rows, 66 MB in
        # Arrow) raised the process's memory by about 400 MiB in its sketch's COPY on two threads, by 100 MiB
        # on one, in less time; on a quiet machine the two threads keep pace and the peak is the same.
        with on_one_thread(self.con):
            for table, (part, sql) in parts.items():
                columns = expected_tables()[table]
                casts = ", ".join(f"#{i + 1}::{dtype} AS {name}" for i, (name, dtype) in enumerate(columns))
                with arrow_view(self.con, "part", part):
                    select = f"SELECT {casts} FROM ({sql.format(fid=file_id)})"
                    staged[table] = self._copy(select, table, file_id)
        return staged

    def stage_empty(self, tables: list[str]) -> dict[str, str]:
        """One Parquet file without rows per table of `tables`, of the staged files' schema: registering it
        makes DuckLake record the table's name map (the one every staged file of the table then reuses)
        and no data file. A store made with these maps never records another, which keeps every process
        clear of a DuckLake race: a name map committed while another process loads the maps is loaded
        twice there, and the second load frees it under a live reference (a segfault, duckdb/ducklake#1431,
        open at 1.5.5)."""
        staged = {}
        for table in tables:
            nulls = ", ".join(f"NULL::{dtype} AS {name}" for name, dtype in expected_tables()[table])
            staged[table] = self._copy(f"SELECT {nulls} WHERE false", table, 0)
        return staged

    def _copy(self, select: str, table: str, file_id: int) -> str:
        target = f"{self.data}main/{table}/proxaudit-{file_id:015x}-{uuid.uuid4().hex}.parquet"
        if "://" not in target:
            Path(target).parent.mkdir(parents=True, exist_ok=True)
        self.con.execute(f"COPY ({select}) TO {literal(target)} (FORMAT parquet, COMPRESSION zstd)")
        return target

    def discard(self, staged: dict[str, str]) -> None:
        """Delete staged files no commit registered (an object's are left to compaction)."""
        for target in staged.values():
            if "://" not in target:
                Path(target).unlink(missing_ok=True)

    def close(self) -> None:
        self.con.close()


def record_name_maps(con: duckdb.DuckDBPyConnection, fresh: bool) -> bool:
    """Record, in the transaction `con` is in, the name map of every staged table of the attached store
    that has none (all of them on a new store, before any other process can see it), from files without
    rows (`Stager.stage_empty` says why); True if any."""
    meta = f"__ducklake_metadata_{STORE}"
    mapped = set() if fresh else {
        table for (table,) in con.execute(
            f"SELECT t.table_name FROM {meta}.ducklake_table t JOIN {meta}.ducklake_column_mapping m "
            "USING (table_id) WHERE t.end_snapshot IS NULL"
        ).fetchall()
    }  # fmt: skip
    missing = [table for table in STAGED_TABLES if table not in mapped]
    if not missing:
        return False
    stager = Stager(con)
    empty = stager.stage_empty(missing)
    try:
        for table, path in empty.items():  # a file without rows leaves its name map and no data file
            con.execute(f"CALL ducklake_add_data_files('{STORE}', '{table}', {literal(path)})")
    finally:
        stager.discard(empty)
        stager.close()
    return True
