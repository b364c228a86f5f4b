"""Reading the metrics store: a store is data, never code.

Readers (`open_store`) attach the store read-only (`evaluator.store.lake`) to a connection of their own,
at its latest snapshot (or an older one: DuckLake's time travel), so they never wait for a writer and
never see part of a commit. They check that it is a proxaudit store of this schema version (every table,
with its columns), switch off file access, and define proxaudit's views and macros (`views.sql`) in the
in-memory database, first on the search path: a query runs proxaudit's SQL over the store's tables,
whatever views or macros a crafted store holds, and cannot read a local file. The checks here serve the
writer too.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import duckdb

from evaluator.duck import connect
from evaluator.errors import StoreError, UsageError
from evaluator.formulas.loss import Loss
from evaluator.store.lake import CATALOG_FILE, DATA_FOLDER, STORE, Location, attach, locate
from schemas.store import METHODS, METRICS, STORE_SCHEMA_VERSION, TABLE_DDL, VIEWS_DDL
from schemas.token_log import RUN_ID_MAX_BYTES

READ_LOCK_WAIT_S = 3.0
TEXT_MAX_BYTES = 8192
"""The longest text a store may hold in a column without a rule of its own (a path, a finding's message)."""
_VALUE_RULES = {
    "run_id": (f"strlen(run_id) > {RUN_ID_MAX_BYTES}", f"longer than {RUN_ID_MAX_BYTES} bytes"),
    "method": (f"method NOT IN ({', '.join(map(repr, METHODS))})", "not a method proxaudit computes"),
    "metric": (f"metric NOT IN ({', '.join(map(repr, METRICS))})", "not a metric proxaudit computes"),
    "digest": ("NOT regexp_full_match(digest, '[0-9a-f]{64}')", "not a BLAKE2b digest"),
}
_CHECKED: dict[tuple, None] = {}
"""Snapshots of stores whose values passed `check_values` in this process: (catalog, snapshot id)."""


class StoreBusy(StoreError):
    """The store's catalog stayed locked by another process for longer than the wait allowed."""


def _columns(con: duckdb.DuckDBPyConnection, catalog: str) -> dict[str, tuple[tuple[str, str], ...]]:
    """Every table and view of the catalog's main schema with its (column, type), in column order."""
    rows = con.execute(
        "SELECT table_name, column_name, data_type FROM duckdb_columns() WHERE database_name = ? "
        "AND schema_name = 'main' ORDER BY table_name, column_index",
        [catalog],
    ).fetchall()
    found: dict[str, list[tuple[str, str]]] = {}
    for table, column, dtype in rows:
        found.setdefault(table, []).append((column, dtype))
    return {t: tuple(c) for t, c in found.items()}


@functools.cache
def expected_tables() -> dict[str, tuple[tuple[str, str], ...]]:
    """The store's tables and their (column, type), from the DDL (a reference in memory)."""
    with connect() as con:
        con.execute(TABLE_DDL)
        return _columns(con, "memory")


def check_store(con: duckdb.DuckDBPyConnection, db: Location | str, catalog: str = STORE) -> None:
    """A `StoreError` unless the catalog holds a proxaudit store of this schema version: every table of the
    DDL as a base table with its columns, the schema
    version recorded, and values replay writes (`check_values`)."""
    found = _columns(con, catalog)
    tables = "SELECT table_name FROM duckdb_tables() WHERE NOT temporary AND database_name = ?"
    base = {t for (t,) in con.execute(tables, [catalog]).fetchall()}
    if "store_meta" not in base:
        what = f"tables {', '.join(sorted(base))}" if base else "views only" if found else "nothing"
        raise StoreError(f"{db} is not a proxaudit metrics store (it holds {what}, no store_meta table)")
    version = f"SELECT value FROM \"{catalog}\".main.store_meta WHERE key = 'store_schema_version'"
    row = con.execute(version).fetchone()
    if row is None or row[0] != STORE_SCHEMA_VERSION:
        found_version = row[0] if row else None
        raise StoreError(
            f"{db}: store schema version {found_version!r}, this proxaudit reads {STORE_SCHEMA_VERSION!r}: "
            "replay the token logs into a new store"
        )
    for table, columns in expected_tables().items():
        if table not in base or found.get(table) != columns:
            got = "missing" if table not in found else "a view" if table not in base else "of other columns"
            raise StoreError(f"{db}: table {table} is {got}: the store was changed by another program")
    check_values(con, db, catalog)


def check_values(con: duckdb.DuckDBPyConnection, db: Location | str, catalog: str) -> None:
    """A `StoreError` unless every text value is one replay writes: a run_id of at most
    `RUN_ID_MAX_BYTES`, a known method and metric, a digest, any other text under `TEXT_MAX_BYTES`. A
    store repeats these on every row, so a crafted one with long or foreign values would cost readers
    memory per row (and put foreign names on charts). One scan per snapshot of a store in a process."""
    key = (str(db), snapshot_id(con, catalog))
    if key in _CHECKED:
        return
    for table, columns in expected_tables().items():
        texts = [c for c, dtype in columns if dtype == "VARCHAR"]
        rules = [
            _VALUE_RULES.get(c, (f"strlen({c}) > {TEXT_MAX_BYTES}", f"over {TEXT_MAX_BYTES} bytes"))
            for c in texts
        ]
        if not texts:
            continue
        counts = con.execute(
            f'SELECT {", ".join(f"count_if({r[0]})" for r in rules)} FROM "{catalog}".main.{table}'
        ).fetchone()
        for column, (_, what), count in zip(texts, rules, counts, strict=True):
            if count:
                raise StoreError(
                    f"{db}: {count:,} values of {table}.{column} are {what}: not a store replay writes"
                )
    if len(_CHECKED) >= 64:
        _CHECKED.pop(next(iter(_CHECKED)))
    _CHECKED[key] = None


def snapshot_id(con: duckdb.DuckDBPyConnection, catalog: str = STORE) -> int:
    """The id of the snapshot the connection reads (each commit of a writer makes one)."""
    return con.execute(f"SELECT id FROM {catalog}.current_snapshot()").fetchone()[0]


def data_path(con: duckdb.DuckDBPyConnection, location: Location) -> str:
    """Where the store's catalog says its Parquet files are: a folder store's own `data/` folder, or an
    object-storage prefix (a `StoreError` for anything else: readers may read those files alone)."""
    rows = con.execute(
        f"SELECT value FROM __ducklake_metadata_{STORE}.ducklake_metadata WHERE key = 'data_path'"
    ).fetchall()
    path = rows[0][0] if rows else ""
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


@contextmanager
def open_store(
    db: str | os.PathLike, lock_wait_s: float = READ_LOCK_WAIT_S, version: int | None = None
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection to the store at its latest snapshot (`version`: an older one, `snapshot_id`), read-only,
    one snapshot for all its queries (a transaction), closed on exit: checked (`check_store`), without file
    access, with proxaudit's views and macros in its
    own in-memory database, which comes first on the search path (the store's tables next). A missing
    store is a `StoreError`."""
    location = locate(db)
    con = _attach(location, lock_wait_s, version)
    try:
        check_store(con, location, STORE)
        con.execute(f"SET search_path = 'memory.main,{STORE}.main'")
        con.execute("SET allowed_directories = [?]", [data_path(con, location)])
        con.execute("SET enable_external_access = false; SET lock_configuration = true")
        con.execute(VIEWS_DDL)
        con.execute("BEGIN TRANSACTION")  # every query of this reader reads one snapshot
        yield con
    finally:
        con.close()


def connect_store(db: str | os.PathLike, read_only: bool = True) -> duckdb.DuckDBPyConnection:
    """A plain connection with the store attached and in use (its tables and its own views), for tools and
    tests that read or repair it directly; proxaudit's readers use `open_store`."""
    con = attach(locate(db), read_only=read_only)
    con.execute(f"USE {STORE}")
    return con


def version_stamp(db: str | os.PathLike) -> tuple[int, ...]:
    """A cheap stamp that changes whenever a writer commits (a cache key): the size and mtime of a folder
    store's catalog and its WAL; a catalog URL is asked for its snapshot id."""
    location = locate(db)
    if location.folder is None:
        with open_store(db) as con:
            return (snapshot_id(con),)
    stats = []
    for path in (location.folder / CATALOG_FILE, location.folder / f"{CATALOG_FILE}-wal"):
        st = path.stat() if path.exists() else None
        stats += [st.st_mtime_ns, st.st_size] if st else [0, 0]
    return tuple(stats)


def require_run(con: duckdb.DuckDBPyConnection, run: str | None, db: str | os.PathLike | Location) -> None:
    """A `UsageError` naming the store's runs when `run` (a `--run` option; None: every run) is not in it."""
    if run is None or con.execute("SELECT 1 FROM file_tokens WHERE run_id = ? LIMIT 1", [run]).fetchall():
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
    rows = con.execute("SELECT value FROM store_meta WHERE key = ?", [LOSS_KEY]).fetchall()  # no result open
    return Loss.from_dict(json.loads(rows[0][0])) if rows else None


def stored_sample(con: duckdb.DuckDBPyConnection) -> float | None:
    """The fraction of sequences the store's metrics summarise (None before the first replay)."""
    rows = con.execute("SELECT value FROM store_meta WHERE key = ?", [SAMPLE_KEY]).fetchall()
    return float(rows[0][0]) if rows else None
