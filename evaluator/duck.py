"""DuckDB connections as proxaudit opens them: every one goes through `connect`.

DuckDB prints a progress bar on standard output (not standard error, and whether or not it is a terminal)
once a query runs past 2 s, so under load it landed inside `--format json` output. `connect` turns it off
for the connection, and its printing too (a later `SET progress_bar_time` turns the bar itself back on);
proxaudit draws its own progress on standard error. It also turns off DuckDB's automatic install and load
of extensions: proxaudit loads the ones it needs from their pip packages by path
(`evaluator.store.lake`) and never downloads one.

Values reach SQL as literals (`literal`) and Arrow tables as streams (`arrow_view`), never as bound
parameters or registered tables: DuckDB's Python client (1.5.5) imports pandas to convert a bound
parameter, and pyarrow.dataset (which imports pandas) to scan a registered table: 0.4 s and 55 MB in every
process that does either. pyarrow itself imports pandas on its first conversion of a Python or numpy value
(`pa.array`), only to recognise pandas objects: proxaudit's own processes (the command line, replay's
workers, watch's looks), which never hand it one, let that first conversion find no pandas
(`arrow_without_pandas`); an explicit conversion (`Table.to_pandas`) still imports it, and the dashboard
runs in a process of its own.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import duckdb
import numpy as np
import pyarrow as pa

NO_DOWNLOADS = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}


_SETTINGS: dict[str, str] = {}
"""The DuckDB settings of the connections `connect` opens now (`settings_of_new_connections`)."""


def connect(
    database: str = ":memory:", read_only: bool = False, checked_extensions: bool = False
) -> duckdb.DuckDBPyConnection:
    """`duckdb.connect(database, read_only)` with DuckDB's progress bar and extension downloads off.
    `checked_extensions`: DuckDB does not check the signature of an extension it loads (the caller loads
    only files whose signature DuckDB checked in this process: `evaluator.store.lake.load`)."""
    config = NO_DOWNLOADS | ({"allow_unsigned_extensions": True} if checked_extensions else {})
    con = duckdb.connect(database, read_only=read_only, config=config)
    con.execute("SET enable_progress_bar = false; SET enable_progress_bar_print = false")
    for name, value in _SETTINGS.items():
        con.execute(f"SET {name} = {value}")
    return con


@contextmanager
def settings_of_new_connections(**settings: str) -> Iterator[None]:
    """The connections `connect` opens meanwhile, in any thread, get these DuckDB settings (SQL values), as
    well as those of an enclosing call."""
    global _SETTINGS
    before = _SETTINGS
    _SETTINGS = before | settings
    try:
        yield
    finally:
        _SETTINGS = before


def one_thread(when: bool = True) -> contextlib.AbstractContextManager:
    """(`when`) The connections `connect` opens meanwhile run each query on one thread: for a small input
    DuckDB's threads cost more than they bring (on two cores, a replay of one 5k-token file 3.5 -> 3.1 s
    and 4.2 -> 3.4 CPU-seconds)."""
    return settings_of_new_connections(threads="1") if when else contextlib.nullcontext()


@contextmanager
def on_one_thread(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """`con`'s database runs its queries on one thread meanwhile (`threads` is a setting of the whole
    database, every connection to it shares it), and back on as many after, on an error too."""
    (threads,) = con.execute("SELECT current_setting('threads')").fetchone()
    con.execute("SET threads = 1")
    try:
        yield
    finally:
        con.execute(f"SET threads = {int(threads)}")


def interrupted(error: BaseException) -> bool:
    """Is `error` a Ctrl-C? DuckDB turns one that comes during a query into an error of its own (a
    `RuntimeError("Query interrupted")` from the Python client, or `duckdb.InterruptException`)."""
    if isinstance(error, KeyboardInterrupt | duckdb.InterruptException):
        return True
    return isinstance(error, RuntimeError) and str(error) == "Query interrupted"


def literal(value: object) -> str:
    """`value` as DuckDB SQL: the one place proxaudit puts a Python value into a query (a bound parameter
    makes DuckDB's Python client import pandas). None is NULL; a bool `true` or `false`; an int its digits;
    a float its shortest repr cast to DOUBLE (the same double back, nan and the infinities too); a str in
    quotes, its quotes doubled (DuckDB's strings have no backslash escapes) and any NUL byte, which would
    end the query's text, joined in as `chr(0)`; a list or tuple a list of its items'."""
    if value is None:
        return "NULL"
    if isinstance(value, bool | np.bool_):
        return "true" if value else "false"
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        return f"'{float(value)!r}'::DOUBLE"
    if isinstance(value, str):
        quoted = "'" + value.replace("'", "''") + "'"
        return "(" + quoted.replace("\x00", "' || chr(0) || '") + ")" if "\x00" in value else quoted
    if isinstance(value, list | tuple):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    raise TypeError(f"no SQL literal for a {type(value).__name__}: {value!r}")


@contextmanager
def arrow_view(con: duckdb.DuckDBPyConnection, name: str, table: pa.Table) -> Iterator[None]:
    """`table` as the view `name` of `con` while the block runs, registered as an Arrow stream: DuckDB reads
    it as it is (a registered `pa.Table` makes it import pyarrow.dataset, and so pandas), and only once. A
    block that reads the rows twice copies them into a table of its own first (a second read is an error,
    never other rows)."""
    con.register(name, table.__arrow_c_stream__())
    try:
        yield
    finally:
        con.unregister(name)


class _NoPandas(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "pandas":
            raise ImportError("pandas is kept out of this process (evaluator.duck.arrow_without_pandas)")
        return None


def arrow_without_pandas() -> None:
    """Have pyarrow settle, now, that pandas is absent (a no-op if pandas is imported already)."""
    if "pandas" in sys.modules:
        return
    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(finder)
