"""A reader's connection that answers each read query once: one judging asks the store the same questions
(a run's engine floor, its steps, its runs) dozens of times, each a scan of the snapshot's files.

Only for a connection that reads one snapshot (`evaluator.store.open_store`'s, inside its transaction):
a repeated query then has the same answer, and the memo lives no longer than the caller's judging.
"""

from __future__ import annotations

from typing import Any

import duckdb


class Memo:
    """`con` whose `execute(sql)` results (`fetchall`, `fetchone`, `fetchnumpy`) are kept per (sql, form);
    every other attribute is the connection's own. Values are in the SQL (`evaluator.duck.literal`)."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self._con = con
        self._answers: dict[tuple[str, str], Any] = {}

    @classmethod
    def of(cls, con: duckdb.DuckDBPyConnection | Memo) -> Memo:
        """`con`'s memo: `con` itself if it is one (a caller's memo goes on serving its callees)."""
        return con if isinstance(con, Memo) else cls(con)

    def execute(self, sql: str) -> _Answer:
        return _Answer(self, sql)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)

    def _answer(self, sql: str, form: str) -> Any:
        key = (sql, form)
        if key not in self._answers:
            self._answers[key] = getattr(self._con.execute(sql), form)()
        return self._answers[key]


class _Answer:
    """The result of one query through a `Memo`, fetched in the form the caller asks for."""

    def __init__(self, memo: Memo, sql: str) -> None:
        self._memo, self._sql = memo, sql

    def fetchall(self) -> list[tuple]:
        return list(self._memo._answer(self._sql, "fetchall"))

    def fetchone(self) -> tuple | None:
        rows = self._memo._answer(self._sql, "fetchall")
        return rows[0] if rows else None

    def fetchnumpy(self) -> dict:
        return {k: v.copy() for k, v in self._memo._answer(self._sql, "fetchnumpy").items()}
