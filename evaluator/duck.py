"""DuckDB connections as proxaudit opens them: every one goes through `connect`.

DuckDB prints a progress bar on standard output (not standard error, and whether or not it is a terminal)
once a query runs past 2 s, so under load it landed inside `--format json` output. `connect` turns it off
for the connection, and its printing too (a later `SET progress_bar_time` turns the bar itself back on);
proxaudit draws its own progress on standard error. It also turns off DuckDB's automatic install and load
of extensions: proxaudit loads the ones it needs from their pip packages by path
(`evaluator.store.lake`) and never downloads one.
"""

from __future__ import annotations

import duckdb

NO_DOWNLOADS = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}


def connect(database: str = ":memory:", read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """`duckdb.connect(database, read_only)` with DuckDB's progress bar and extension downloads off."""
    con = duckdb.connect(database, read_only=read_only, config=NO_DOWNLOADS)
    con.execute("SET enable_progress_bar = false; SET enable_progress_bar_print = false")
    return con


def interrupted(error: BaseException) -> bool:
    """Is `error` a Ctrl-C? DuckDB turns one that comes during a query into an error of its own (a
    `RuntimeError("Query interrupted")` from the Python client, or `duckdb.InterruptException`)."""
    if isinstance(error, KeyboardInterrupt | duckdb.InterruptException):
        return True
    return isinstance(error, RuntimeError) and str(error) == "Query interrupted"
