"""The metrics store (DuckDB): open or create it, ingest one file's summaries atomically (refusing a file
that repeats a stored token), look up digests.

DuckDB allows one writing process or many read-only ones. The dashboard opens the database read-only
for each query, so a writer here holds its connection only for as long as it commits one file: replay
computes a file's summaries with the database closed, then `ingest` opens, inserts everything in one
transaction, commits and closes. A lock held by a reader is waited for (`LOCK_WAIT_S`), not fought.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import duckdb
import pyarrow as pa

from evaluator.decisions import DEFAULT_PARAMS, DecisionParams
from evaluator.errors import StoreError
from evaluator.file_facts import duplicate_message, overlaps_sql
from evaluator.file_summary import FileSummary
from evaluator.problems import Problem
from schemas.store import STORE_DDL, STORE_SCHEMA_VERSION

LOCK_WAIT_S = 30.0
PARAMS_KEY = "decision_params"
CRASH_ENV = "PROXAUDIT_CRASH_BEFORE_COMMIT"
"""Fault injection for tests: when set to a file's name, replay dies (os._exit) after inserting that
file's rows and before committing them, as a kill -9 would."""


def file_digest(path: str | os.PathLike) -> str:
    """BLAKE2b (256-bit) of the file's bytes: the same bytes are never counted twice."""
    digest = hashlib.blake2b(digest_size=32)
    with open(path, "rb") as source:
        while chunk := source.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _connect(db_path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            return duckdb.connect(str(db_path), read_only=read_only)
        except duckdb.IOException as error:
            if "lock" not in str(error).lower() or time.monotonic() > deadline:
                raise StoreError(f"cannot open the metrics database {db_path}: {error}") from error
            time.sleep(0.1)
        except duckdb.Error as error:
            raise StoreError(f"{db_path} is not a DuckDB database: {error}") from error


def _check_version(con: duckdb.DuckDBPyConnection, db_path: Path) -> None:
    try:
        rows = con.execute("SELECT value FROM store_meta WHERE key = 'store_schema_version'").fetchall()
    except duckdb.CatalogException as error:
        raise StoreError(f"{db_path} is not a proxaudit metrics database (no store_meta table)") from error
    found = rows[0][0] if rows else None
    if found != STORE_SCHEMA_VERSION:
        raise StoreError(f"{db_path}: store schema version {found!r}, expected {STORE_SCHEMA_VERSION!r}")


@contextmanager
def open_store(db_path: str | os.PathLike, *, write: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection to the store, closed on exit. Reading a missing database is a `StoreError`; writing
    creates it (and its folder) and applies the DDL, which is idempotent."""
    db_path = Path(db_path)
    if not write and not db_path.is_file():
        raise StoreError(
            f"no metrics database at {db_path}: run `proxaudit replay LOGS --db {db_path}` first"
        )
    if write:
        db_path.parent.mkdir(parents=True, exist_ok=True)
    con = _connect(db_path, read_only=not write)
    try:
        if write:
            con.execute(STORE_DDL)
            con.execute(
                "INSERT INTO store_meta VALUES ('store_schema_version', ?) ON CONFLICT DO NOTHING",
                [STORE_SCHEMA_VERSION],
            )
        _check_version(con, db_path)
        yield con
    finally:
        con.close()


def stored_params(con: duckdb.DuckDBPyConnection) -> DecisionParams | None:
    """The decision parameters the store's metrics were computed with (None before the first replay)."""
    row = con.execute("SELECT value FROM store_meta WHERE key = ?", [PARAMS_KEY]).fetchone()
    return None if row is None else DecisionParams(**json.loads(row[0]))


def ingested_digests(db_path: str | os.PathLike, params: DecisionParams = DEFAULT_PARAMS) -> set[str]:
    """Digests of every file already in the store (creating the store if it does not exist). A store
    holds metrics of one set of decision parameters: the first replay records `params`, a later one
    with other parameters is a `StoreError` (the two would mix silently)."""
    with open_store(db_path, write=True) as con:
        recorded = stored_params(con)
        if recorded is None:
            con.execute("INSERT INTO store_meta VALUES (?, ?)", [PARAMS_KEY, json.dumps(asdict(params))])
        elif recorded != params:
            raise StoreError(
                f"{db_path} holds metrics computed with {_params_text(recorded)}; this replay asks for "
                f"{_params_text(params)}. One store holds one parameter set: replay with the same "
                "parameters, or into another database"
            )
        return {row[0] for row in con.execute("SELECT digest FROM ingested_file").fetchall()}


def _params_text(p: DecisionParams) -> str:
    return f"eps_low {p.eps_low:g}, eps_high {p.eps_high:g}, bound {p.bound:g} ({p.bound_action})"


_INSERTS = {
    "file_tokens": "SELECT {fid}, run_id, step, staleness, sum(n_tokens), sum(n_prox) FROM part "
    "GROUP BY run_id, step, staleness ORDER BY run_id, step, staleness",
    "metric_moments": "SELECT {fid}, run_id, step, staleness, method, metric, sum(n), sum(sum), sum(sum_sq), "
    "min(min), max(max) FROM part GROUP BY ALL ORDER BY run_id, method, metric, step, staleness",
    "sketch_by_step": "SELECT {fid}, run_id, step, method, metric, bucket, sum(count) FROM part "
    "GROUP BY ALL ORDER BY run_id, method, metric, step, bucket",
    "sketch_by_staleness": "SELECT {fid}, run_id, staleness, method, metric, bucket, sum(count) FROM part "
    "GROUP BY ALL ORDER BY run_id, method, metric, staleness, bucket",
}


def _duplicates(con: duckdb.DuckDBPyConnection) -> Problem | None:
    """`duplicate_across_files` when a sequence of the registered `part_sequences` overlaps a stored one
    (same run_id, seq_id, minibatch and overlapping pos ranges), naming the first file that holds them."""
    in_range = "e.seq_id BETWEEN (SELECT min(seq_id) FROM part_sequences) AND " + (
        "(SELECT max(seq_id) FROM part_sequences)"  # lets DuckDB skip stored row groups by their min/max
    )
    sql = overlaps_sql("part_sequences", "file_sequences", "0", "e.file_id", in_range)
    row = con.execute(sql).fetchone()
    if row is None:
        return None
    _, holder, others, n_rows, n_seqs, example = row
    (path,) = con.execute("SELECT path FROM ingested_file WHERE file_id = ?", [holder]).fetchone()
    return Problem(
        "duplicate_across_files", "seq_id", n_rows, duplicate_message(n_rows, n_seqs, path, example, others)
    )


def ingest(
    db_path: str | os.PathLike, path: Path, digest: str, summary: FileSummary, sequences: pa.Table
) -> bool | Problem:
    """Insert one file's summaries and token identity (`FileFacts.sequences`) in a single transaction.
    False (and no change) if its digest is already in the store; a `duplicate_across_files` problem (and
    no change) if it repeats a token of a stored file. A crash before the commit leaves the store as it
    was."""
    with open_store(db_path, write=True) as con:
        con.execute("BEGIN TRANSACTION")
        if con.execute("SELECT 1 FROM ingested_file WHERE digest = ?", [digest]).fetchall():
            con.execute("ROLLBACK")
            return False
        con.register("part_sequences", sequences)
        duplicate = _duplicates(con)
        if duplicate is not None:
            con.execute("ROLLBACK")
            return duplicate
        file_id = con.execute("SELECT coalesce(max(file_id), 0) + 1 FROM ingested_file").fetchall()[0][0]
        con.execute(
            "INSERT INTO ingested_file VALUES (?, ?, ?, ?, ?, now())",
            [file_id, digest, str(path.resolve()), summary.n_rows, summary.n_tokens],
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
        for table, part in tables.items():
            con.register("part", part)
            con.execute(f"INSERT INTO {table} " + _INSERTS[table].format(fid=int(file_id)))
            con.unregister("part")
        if os.environ.get(CRASH_ENV) == path.name:
            os._exit(70)
        con.execute("COMMIT")
    return True
