"""Reading the metrics store: a store is data, never code.

Readers (`open_store`) attach the store read-only (`evaluator.store.lake`) to a connection of their own,
at its latest snapshot (or an older one: DuckLake's time travel), so they never wait for a writer and
never see part of a commit. They check that it is a proxaudit store of this schema version (every table,
with its columns), switch off file access, and define proxaudit's views and macros (`views.sql`) in the
in-memory database, first on the search path: a query runs proxaudit's SQL over the store's tables,
whatever views or macros a crafted store holds, and cannot read a local file (`evaluator.store.checks`).
Prepared connections are kept for the next reader of the same store in the process.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import duckdb
import pyarrow as pa

from evaluator.duck import literal
from evaluator.errors import StoreError, UsageError
from evaluator.formulas.loss import Loss
from evaluator.store.checks import check_store, snapshot_id
from evaluator.store.lake import (
    CATALOG_FILE,
    DATA_FOLDER,
    STORE,
    Location,
    attach,
    locate,
    store_key,
    stored_data_path,
)
from schemas.store import VIEWS_DDL

READ_LOCK_WAIT_S = 3.0
POOL_SIZE = 4
"""Idle reader connections kept per store in a process: a reader opens one in a few milliseconds (a new
one attaches the store, checks it and defines the views; its first in a process also has the extensions'
signatures checked, about a quarter of a second), each on the latest snapshot."""
_POOL: dict[str, list[duckdb.DuckDBPyConnection]] = {}
_POOL_LOCK = threading.Lock()


class StoreBusy(StoreError):
    """The store's catalog stayed locked by another process for longer than the wait allowed."""


def data_path(con: duckdb.DuckDBPyConnection, location: Location) -> str:
    """Where the store's catalog says its Parquet files are: a folder store's own `data/` folder, or an
    object-storage prefix (a `StoreError` for anything else: readers may read those files alone)."""
    path = stored_data_path(con)
    own = str(location.folder / DATA_FOLDER) if location.folder is not None else None
    remote = path.startswith(("s3://", "gs://")) and len(path.split("/")) > 3
    local = (
        path.rstrip(os.sep) == own if own is not None else os.path.isabs(path) and path.strip(os.sep) != ""
    )
    if not (remote or local):
        raise StoreError(f"{location}: its catalog places the data files at {path!r}, outside the store")
    return path


def ingested_files(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str]]:
    """(digest, path) of every file in the store, in the order they were recorded."""
    return con.execute("SELECT digest, path FROM ingested_file ORDER BY ingested_at, digest").fetchall()


def _attach(location: Location, wait_s: float, version: int | None) -> duckdb.DuckDBPyConnection:
    """The store attached read-only, retrying while its catalog is locked (`StoreBusy` after `wait_s`)."""
    deadline, delay = time.monotonic() + wait_s, 0.02
    while True:
        try:
            return attach(location, read_only=True, version=version)
        except StoreError as error:
            if "locked" not in str(error).lower():
                raise
            if time.monotonic() >= deadline:
                raise StoreBusy(f"{location}: locked by another process: {error}") from error
            time.sleep(delay)
            delay = min(2 * delay, 0.25)


def _prepared(location: Location, wait_s: float, version: int | None) -> duckdb.DuckDBPyConnection:
    """A reader's connection: the store attached read-only, proxaudit's views in its in-memory database
    (first on the search path), file access off but for the store's data files."""
    con = _attach(location, wait_s, version)
    try:
        check_store(con, location, STORE, values=False)
        con.execute(f"SET search_path = 'memory.main,{STORE}.main'")
        con.execute(f"SET allowed_directories = {literal([data_path(con, location)])}")
        con.execute("SET enable_external_access = false; SET lock_configuration = true")
        con.execute(VIEWS_DDL)
    except BaseException:
        con.close()
        raise
    return con


@contextmanager
def open_store(
    db: str | os.PathLike, lock_wait_s: float = READ_LOCK_WAIT_S, version: int | None = None
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection to the store at its latest snapshot (`version`: an older one, `snapshot_id`), read-only,
    one snapshot for all its queries (a transaction): checked (`evaluator.store.checks`), without file
    access, with proxaudit's views and macros in its own in-memory database, which comes first on the
    search path (the store's tables next). A missing store is a `StoreError`."""
    location = locate(db)
    if not location.exists():
        raise StoreError(f"no metrics store at {location}: run `proxaudit replay LOGS --db {location}` first")
    key = store_key(location) if version is None else None
    with _POOL_LOCK:
        idle = _POOL.get(key, []) if key else []
        con = idle.pop() if idle else None
    con = con or _prepared(location, lock_wait_s, version)
    clean = False
    try:
        con.execute("BEGIN TRANSACTION")  # every query of this reader reads one snapshot
        check_store(con, location, STORE)
        yield con
        clean = True
    finally:
        keep = clean and key is not None and _end(con)
        with _POOL_LOCK:
            if keep and len(_POOL.setdefault(key, [])) < POOL_SIZE:
                _POOL[key].append(con)
            else:
                con.close()


def _end(con: duckdb.DuckDBPyConnection) -> bool:
    """End the reader's transaction; False when the connection is no longer fit to keep."""
    try:
        con.execute("ROLLBACK")
        return True
    except duckdb.Error:
        return False


def connect_store(db: str | os.PathLike, read_only: bool = True) -> duckdb.DuckDBPyConnection:
    """A plain connection with the store attached and in use (its tables and its own views), for tools and
    tests that read or repair it directly; proxaudit's readers use `open_store`."""
    con = attach(locate(db), read_only=read_only)
    con.execute(f"USE {STORE}")
    return con


def version_stamp(db: str | os.PathLike) -> tuple[int, ...]:
    """A cheap stamp that changes whenever a writer commits (a cache key): the size and mtime of a folder
    store's catalog and its WAL, an empty WAL counted as none (the first reader after the last writer
    closed creates one; a commit never leaves one empty); a catalog URL is asked for its snapshot id."""
    location = locate(db)
    if location.folder is None:
        with open_store(db) as con:
            return (snapshot_id(con),)
    stats = []
    for path in (location.folder / CATALOG_FILE, location.folder / f"{CATALOG_FILE}-wal"):
        st = path.stat() if path.exists() else None
        stats += [st.st_mtime_ns, st.st_size] if st and st.st_size else [0, 0]
    return tuple(stats)


def require_run(con: duckdb.DuckDBPyConnection, run: str | None, db: str | os.PathLike | Location) -> None:
    """A `UsageError` naming the store's runs when `run` (a `--run` option; None: every run) is not in it."""
    sql = f"SELECT 1 FROM file_tokens WHERE run_id = {literal(run)} LIMIT 1"
    if run is None or con.execute(sql).fetchall():
        return
    runs = [r for (r,) in con.execute("SELECT DISTINCT run_id FROM file_tokens ORDER BY 1").fetchall()]
    raise UsageError(f"no run {run!r} in {db}; runs: {', '.join(runs) or 'none'}")


def runs_without_truth(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """`{run_id: loss tokens}` of the stored runs none of whose tokens has `prox_logp` (the ground truth):
    runs with no error or decision figure at all."""
    sql = "SELECT run_id, sum(n_tokens) FROM file_tokens GROUP BY run_id HAVING sum(n_prox) = 0 ORDER BY 1"
    return {run: int(n) for run, n in con.execute(sql).fetchall()}


LOSS_KEY = "loss"
"""The `store_meta` key of the loss the store's decision metrics were computed under (JSON)."""
SAMPLE_KEY = "sample_sequences"
"""The `store_meta` key of the fraction of sequences the store's metrics summarise (`--sample-sequences`)."""


def stored_loss(con: duckdb.DuckDBPyConnection) -> Loss | None:
    """The loss the store's metrics were computed under (None before the first replay)."""
    sql = f"SELECT value FROM store_meta WHERE key = {literal(LOSS_KEY)}"
    rows = con.execute(sql).fetchall()  # no result open
    return Loss.from_dict(json.loads(rows[0][0])) if rows else None


def stored_sample(con: duckdb.DuckDBPyConnection) -> float | None:
    """The fraction of sequences the store's metrics summarise (None before the first replay)."""
    rows = con.execute(f"SELECT value FROM store_meta WHERE key = {literal(SAMPLE_KEY)}").fetchall()
    return float(rows[0][0]) if rows else None


MAX_STALENESS_KEY = "max_staleness"
"""The `store_meta` key of the trainer's maximum staleness a replay was told (JSON: value, source, key)."""


def stored_max_staleness(con: duckdb.DuckDBPyConnection) -> tuple[int, str, str] | None:
    """(the trainer's maximum staleness, where it was read, the config key that sets it) as the latest
    replay that knew it recorded it: its `--max-staleness`, or the trainer's config given with
    `--loss-from`; None if none did."""
    rows = con.execute(f"SELECT value FROM store_meta WHERE key = {literal(MAX_STALENESS_KEY)}").fetchall()
    if not rows:
        return None
    recorded = json.loads(rows[0][0])
    return int(recorded["value"]), str(recorded["source"]), str(recorded["key"])


def what_if_rows(con: duckdb.DuckDBPyConnection, run: str | None = None) -> pa.Table:
    """The what-if table (of `run`, or every run): per run its own loss first, then the others by name."""
    where = f"WHERE run_id = {literal(run)}" if run is not None else ""
    sql = f"SELECT * FROM what_if {where} ORDER BY run_id, NOT own, loss, method"
    return con.sql(sql).to_arrow_table()
