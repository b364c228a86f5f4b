"""Is an attached store one proxaudit wrote? Its tables and columns, its schema version, and every text value
one replay writes: a store is data, never code, and a crafted one must not cost readers memory per row or
put foreign names on charts."""

from __future__ import annotations

import contextlib
import functools

import duckdb

from evaluator.duck import connect, literal
from evaluator.errors import StoreError
from evaluator.store import checked_record
from evaluator.store.lake import STORE, Location, store_key
from schemas.store import METHODS, METRICS, STORE_SCHEMA_VERSION, TABLE_DDL
from schemas.token_log import RUN_ID_MAX_BYTES

TEXT_MAX_BYTES = 8192
"""The longest text a store may hold in a column without a rule of its own (a path, a finding's message)."""
_VALUE_RULES = {
    "run_id": (f"strlen(run_id) > {RUN_ID_MAX_BYTES}", f"longer than {RUN_ID_MAX_BYTES} bytes"),
    "method": (f"method NOT IN ({', '.join(map(repr, METHODS))})", "not a method proxaudit computes"),
    "metric": (f"metric NOT IN ({', '.join(map(repr, METRICS))})", "not a metric proxaudit computes"),
    "digest": ("NOT regexp_full_match(digest, '[0-9a-f]{64}')", "not a BLAKE2b digest"),
}
_CHECKED: dict[str, int] = {}
"""The snapshot up to which each store's values passed `check_values` in this process (or were written by
it: `written`, `made`; or by another: `checked_record`, `trust_checked`)."""
_SOUND: dict[str, int] = {}
"""The snapshot at which each store's tables last passed `check_tables` in this process."""


def _columns(con: duckdb.DuckDBPyConnection, catalog: str) -> dict[str, tuple[tuple[str, str], ...]]:
    """Every table and view of the catalog's main schema with its (column, type), in column order."""
    rows = con.execute(
        "SELECT table_name, column_name, data_type FROM duckdb_columns() "
        f"WHERE database_name = {literal(catalog)} AND schema_name = 'main' ORDER BY table_name, column_index"
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


def check_store(
    con: duckdb.DuckDBPyConnection, db: Location, catalog: str = STORE, values: bool = True
) -> None:
    """A `StoreError` unless the catalog holds a proxaudit store of this schema version: every table of the
    DDL as a base table with its columns, the schema version recorded (`check_tables`), and (with
    `values`) values replay writes (`check_values`). The tables are read once per snapshot: not again at a
    snapshot this process found sound, nor at one checked whole (values included) in this process or,
    by its record, in an earlier one; a snapshot changes with every commit, another program's DDL
    included."""
    key, now = store_key(db), snapshot_id(con, catalog)
    since = _checked_since(con, key, catalog)
    if now not in (since, _SOUND.get(key)):
        check_tables(con, db, catalog)
        _remember(_SOUND, key, now)
    if values:
        check_values(con, db, catalog, key, now, since)


def check_tables(con: duckdb.DuckDBPyConnection, db: Location, catalog: str) -> None:
    """A `StoreError` unless every table of the DDL is a base table of the catalog with its columns, and
    the schema version recorded is this proxaudit's."""
    found = _columns(con, catalog)
    sql = f"SELECT table_name FROM duckdb_tables() WHERE NOT temporary AND database_name = {literal(catalog)}"
    base = {t for (t,) in con.execute(sql).fetchall()}
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


def _checked_since(con: duckdb.DuckDBPyConnection, key: str, catalog: str) -> int | None:
    """The snapshot up to which the store of `key` was checked whole: in this process, else by a record
    of an earlier one (`checked_record`), then remembered here."""
    since = _CHECKED.get(key)
    if since is None:
        since = checked_record.recorded(con, key, catalog)
        if since is not None:
            _remember(_CHECKED, key, since)
    return since


def check_values(
    con: duckdb.DuckDBPyConnection, db: Location, catalog: str, key: str, now: int, since: int | None
) -> None:
    """A `StoreError` unless every text value is one replay writes: a run_id of at most
    `RUN_ID_MAX_BYTES`, a known method and metric, a digest, any other text under `TEXT_MAX_BYTES`. A
    store repeats these on every row, so a crafted one with long or foreign values would cost readers
    memory per row (and put foreign names on charts). Each row is checked once: a snapshot after one
    already checked (`since`, of the store of `key`, which the connection reads at snapshot `now`), in this
    process or in an earlier one (`checked_record`), has the rows inserted since read (DuckLake's
    `ducklake_table_insertions`), and a commit of this process right after a checked snapshot counts as
    checked (`written`)."""
    if since == now:
        return
    for table, columns in expected_tables().items():
        texts = [c for c, dtype in columns if dtype == "VARCHAR"]
        if not texts:
            continue
        rules = [
            _VALUE_RULES.get(c, (f"strlen({c}) > {TEXT_MAX_BYTES}", f"over {TEXT_MAX_BYTES} bytes"))
            for c in texts
        ]
        counts = ", ".join(f"count_if({r[0]})" for r in rules)
        rows = f'"{catalog}".main.{table}'
        if since is not None and since < now:
            rows = f"ducklake_table_insertions('{catalog}', 'main', '{table}', {since + 1}, {now})"
        try:
            found = con.execute(f"SELECT {counts} FROM {rows}").fetchone()
        except duckdb.Error:  # the snapshot checked before was expired: all of it again
            found = con.execute(f'SELECT {counts} FROM "{catalog}".main.{table}').fetchone()
        for column, (_, what), count in zip(texts, rules, found, strict=True):
            if count:
                raise StoreError(
                    f"{db}: {count:,} values of {table}.{column} are {what}: not a store replay writes"
                )
    if since is None or now > since:  # an older snapshot (a reader's `version`) leaves the later one kept
        _remember(_CHECKED, key, now)
        checked_record.record(con, key, catalog, now)


def _remember(snapshots: dict[str, int], key: str, snapshot: int) -> None:
    if len(snapshots) >= 64 and key not in snapshots:
        snapshots.pop(next(iter(snapshots)))
    snapshots[key] = snapshot


def written(con: duckdb.DuckDBPyConnection, db: Location, catalog: str = STORE) -> None:
    """After a commit of this process's writer that wrote rows (never after one that committed nothing: the
    latest snapshot is then another writer's): its snapshot counts as checked when it directly follows one
    checked (no other writer's commit between; the rows a writer inserts are replay's by construction),
    so a reader in this process does not read them again (nor one in a later process, once `keep` records
    it)."""
    key, now = store_key(db), snapshot_id(con, catalog)
    if _CHECKED.get(key) == now - 1:
        _remember(_CHECKED, key, now)


def made(con: duckdb.DuckDBPyConnection, db: Location, snapshot: int, catalog: str = STORE) -> None:
    """A store this process's writer made, set up in `snapshot`: checked up to it while no other writer
    committed since (every row in it is this writer's)."""
    if snapshot_id(con, catalog) == snapshot:
        _remember(_CHECKED, store_key(db), snapshot)


def keep(con: duckdb.DuckDBPyConnection, db: Location, catalog: str = STORE) -> None:
    """Record on disk the snapshot up to which this process checked (or wrote) the store, for later
    processes (`checked_record`): a writer does when it closes."""
    key = store_key(db)
    if key in _CHECKED:
        with contextlib.suppress(duckdb.Error):  # a connection left in a failed transaction: no record
            checked_record.record(con, key, catalog, _CHECKED[key])


def checked_up_to(db: Location) -> tuple[str, int] | None:
    """The store's key and the snapshot up to which this process checked its values (None: not checked)."""
    key = store_key(db)
    return (key, _CHECKED[key]) if key in _CHECKED else None


def trust_checked(checked: tuple[str, int] | None) -> None:
    """Take `checked_up_to` of another process of this program (watch's previous look process) as checked
    here: rows at or before that snapshot are not read again."""
    if checked is not None and checked[1] > _CHECKED.get(checked[0], -1):
        _remember(_CHECKED, *checked)


def snapshot_id(con: duckdb.DuckDBPyConnection, catalog: str = STORE) -> int:
    """The id of the snapshot the connection reads (each commit of a writer makes one)."""
    return con.execute(f"SELECT id FROM {catalog}.current_snapshot()").fetchone()[0]
