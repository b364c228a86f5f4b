"""Reading the metrics store: a store is data, never code.

Readers (`open_store`) attach the published file read-only to a connection of their own (an in-memory
database, first on the search path), check that it is a proxaudit store of this schema version (every
table, with its columns), switch off file access, and define proxaudit's views and macros (`views.sql`) in
the in-memory database: a query runs proxaudit's SQL over the store's tables, whatever views or macros a
crafted file holds, and cannot read a local file. The checks here serve the writer too.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import pyarrow as pa

from evaluator.duck import connect
from evaluator.errors import StoreError, UsageError
from evaluator.formulas.loss import Loss
from schemas.store import METHODS, METRICS, STORE_SCHEMA_VERSION, TABLE_DDL, VIEWS_DDL
from schemas.token_log import RUN_ID_MAX_BYTES

READ_LOCK_WAIT_S = 3.0
STORE = "store"
"""The name a reader attaches the store under."""
DUCKDB_MAGIC = b"DUCK"  # bytes 8..12 of a DuckDB database file
TEXT_MAX_BYTES = 8192
"""The longest text a store may hold in a column without a rule of its own (a path, a finding's message)."""
_VALUE_RULES = {
    "run_id": (f"strlen(run_id) > {RUN_ID_MAX_BYTES}", f"longer than {RUN_ID_MAX_BYTES} bytes"),
    "method": (f"method NOT IN ({', '.join(map(repr, METHODS))})", "not a method proxaudit computes"),
    "metric": (f"metric NOT IN ({', '.join(map(repr, METRICS))})", "not a metric proxaudit computes"),
    "digest": ("NOT regexp_full_match(digest, '[0-9a-f]{64}')", "not a BLAKE2b digest"),
}
_CHECKED: dict[tuple, None] = {}
"""Published stores whose values passed `check_values` in this process: (path, inode, size, mtime)."""


class StoreBusy(StoreError):
    """The store stayed locked by another process for longer than the wait allowed."""


def check_db_path(db: str | os.PathLike) -> Path:
    """The store's path, or a `StoreError` for what cannot hold one: `:memory:` (nothing would be kept),
    a folder, or a file that is not a DuckDB database (Parquet, CSV, ...)."""
    text = str(db)
    if not text or text.startswith(":memory:"):
        raise StoreError(f"--db {text!r}: an in-memory database keeps nothing; give a file path")
    path = Path(text)
    if path.is_dir():
        raise StoreError(f"--db {path}: is a folder, not a database file")
    if path.exists():
        with open(path, "rb") as source:
            head = source.read(16)
        if head[8:12] != DUCKDB_MAGIC:
            kind = "a Parquet file" if head[:4] == b"PAR1" else "not a DuckDB database"
            raise StoreError(f"--db {path}: {kind}; give the path of a proxaudit metrics database")
    return path


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


def check_store(con: duckdb.DuckDBPyConnection, db: Path, catalog: str | None = None) -> None:
    """A `StoreError` unless the catalog (the connection's own database by default) holds a proxaudit
    store of this schema version: every table of the DDL as a base table with its columns, the schema
    version recorded, and values replay writes (`check_values`)."""
    catalog = catalog or con.execute("SELECT current_database()").fetchone()[0]
    found = _columns(con, catalog)
    tables = "SELECT table_name FROM duckdb_tables() WHERE NOT temporary AND database_name = ?"
    base = {t for (t,) in con.execute(tables, [catalog]).fetchall()}
    if "store_meta" not in base:
        what = f"tables {', '.join(sorted(base))}" if base else "views only" if found else "nothing"
        raise StoreError(f"{db} is not a proxaudit metrics database (it holds {what}, no store_meta table)")
    version = f"SELECT value FROM \"{catalog}\".main.store_meta WHERE key = 'store_schema_version'"
    row = con.execute(version).fetchone()
    if row is None or row[0] != STORE_SCHEMA_VERSION:
        found_version = row[0] if row else None
        raise StoreError(
            f"{db}: store schema version {found_version!r}, this proxaudit reads {STORE_SCHEMA_VERSION!r}: "
            "replay the token logs into a new database"
        )
    for table, columns in expected_tables().items():
        if table not in base or found.get(table) != columns:
            got = "missing" if table not in found else "a view" if table not in base else "of other columns"
            raise StoreError(f"{db}: table {table} is {got}: the store was changed by another program")
    check_values(con, db, catalog)


def check_values(con: duckdb.DuckDBPyConnection, db: Path, catalog: str) -> None:
    """A `StoreError` unless every text value is one replay writes: a run_id of at most
    `RUN_ID_MAX_BYTES`, a known method and metric, a digest, any other text under `TEXT_MAX_BYTES`. A
    store repeats these on every row, so a crafted one with long or foreign values would cost readers
    memory per row (and put foreign names on charts). One scan per published file in a process."""
    info = db.stat()
    key = (str(db), info.st_ino, info.st_size, info.st_mtime_ns)
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


def _attach(con: duckdb.DuckDBPyConnection, db: Path, wait_s: float) -> None:
    """Attach `db` read-only as `STORE`, retrying while another process holds the file's lock
    (`StoreBusy` after `wait_s`)."""
    deadline, delay = time.monotonic() + wait_s, 0.02
    path = str(db).replace("'", "''")
    while True:
        try:
            con.execute(f"ATTACH '{path}' AS {STORE} (READ_ONLY)")
            return
        except duckdb.IOException as error:
            if "lock" not in str(error).lower():
                raise StoreError(f"cannot open the metrics database {db}: {error}") from error
            if time.monotonic() >= deadline:
                raise StoreBusy(f"{db}: locked by another process: {error}") from error
            time.sleep(delay)
            delay = min(2 * delay, 0.25)
        except duckdb.Error as error:
            raise StoreError(f"{db} is not a DuckDB database: {error}") from error


@contextmanager
def open_store(
    db: str | os.PathLike, lock_wait_s: float = READ_LOCK_WAIT_S
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection to the published store, read-only, closed on exit: checked (`check_store`), without
    file access, with proxaudit's views and macros in its own in-memory database, which comes first on the
    search path (the store's tables next). A missing database is a `StoreError`, one locked by another
    program past `lock_wait_s` a `StoreBusy`."""
    db = check_db_path(db)
    if not db.is_file():
        raise StoreError(f"no metrics database at {db}: run `proxaudit replay LOGS --db {db}` first")
    con = connect()
    try:
        _attach(con, db, lock_wait_s)
        check_store(con, db, STORE)
        con.execute(f"SET search_path = 'memory.main,{STORE}.main'")
        con.execute("SET enable_external_access = false; SET lock_configuration = true")
        con.execute(VIEWS_DDL)
        yield con
    finally:
        con.close()


def require_run(con: duckdb.DuckDBPyConnection, run: str | None, db: str | os.PathLike) -> None:
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


def stored_loss(con: duckdb.DuckDBPyConnection) -> Loss | None:
    """The loss the store's metrics were computed under (None before the first replay)."""
    rows = con.execute("SELECT value FROM store_meta WHERE key = ?", [LOSS_KEY]).fetchall()  # no result open
    return Loss.from_dict(json.loads(rows[0][0])) if rows else None


MAX_STALENESS_KEY = "max_staleness"
"""The `store_meta` key of the trainer's maximum staleness a replay was told (JSON: value, source, key)."""


def stored_max_staleness(con: duckdb.DuckDBPyConnection) -> tuple[int, str, str] | None:
    """(the trainer's maximum staleness, where it was read, the config key that sets it) as the latest
    replay that knew it recorded it: its `--max-staleness`, or the trainer's config given with
    `--loss-from`; None if none did."""
    rows = con.execute("SELECT value FROM store_meta WHERE key = ?", [MAX_STALENESS_KEY]).fetchall()
    if not rows:
        return None
    recorded = json.loads(rows[0][0])
    return int(recorded["value"]), str(recorded["source"]), str(recorded["key"])


def what_if_rows(con: duckdb.DuckDBPyConnection, run: str | None = None) -> pa.Table:
    """The what-if table (of `run`, or every run): per run its own loss first, then the others by name."""
    where, params = ("WHERE run_id = ?", [run]) if run is not None else ("", [])
    sql = f"SELECT * FROM what_if {where} ORDER BY run_id, NOT own, loss, method"
    return con.sql(sql, params=params).to_arrow_table()
