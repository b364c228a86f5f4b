"""`proxaudit query`: one SQL statement that reads, run on the store opened read-only."""

from __future__ import annotations

import os

import duckdb
import pyarrow as pa

from evaluator.errors import UsageError
from evaluator.store import open_store

READ_ONLY_SQL = "SELECT (also WITH ..., FROM ..., VALUES, TABLE, DESCRIBE, SHOW, SUMMARIZE)"
"""The one kind of statement `query` runs: a statement of another kind (DROP, CREATE, SET, ...) would only
change the reader's own throw-away views, never the store, and must not read as done."""


def read_only_statement(sql: str) -> None:
    """A `UsageError` unless `sql` is one statement that only reads (`READ_ONLY_SQL`), naming what it is."""
    try:
        kinds = [s.type.name for s in duckdb.extract_statements(sql)]
    except duckdb.Error as error:
        raise UsageError(f"query failed: {error}") from None
    if kinds != ["SELECT"]:
        found = f"{len(kinds)} statements ({', '.join(kinds)})" if kinds else "no statement"
        found = f"one {kinds[0]} statement" if len(kinds) == 1 else found
        raise UsageError(
            f"query runs one statement that reads the store, a {READ_ONLY_SQL}; this is {found}, "
            "not run. Only `proxaudit replay` writes the store"
        )


def query_table(db_path: str | os.PathLike, sql: str) -> pa.Table:
    """The rows of one SQL statement that reads (`read_only_statement`) on the store, opened read-only. A
    missing database is a `StoreError`, another statement or a query DuckDB rejects a `UsageError`."""
    read_only_statement(sql)
    with open_store(db_path) as con:
        try:
            return con.sql(sql).to_arrow_table()
        except duckdb.Error as error:
            raise UsageError(f"query failed: {error}") from None
