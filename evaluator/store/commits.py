"""One transaction of a writer, committed as one snapshot of the store, run again while another writer
commits first.

DuckLake commits optimistically: a transaction reads the snapshot it began on and fails at COMMIT when
another writer's commit conflicts with it (a SQLite catalog lets no two writers' transactions overlap:
the later one fails with "database is locked"; PostgreSQL fails on a row both changed). The failed
transaction leaves nothing, so `committed` runs it again on the newer snapshot: whatever it checked (a
file not yet stored, no token repeated) is checked again against what the other writer committed.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Callable
from typing import TypeVar

import duckdb

from evaluator.errors import StoreError

T = TypeVar("T")
MAX_TRIES = 200
FIRST_WAIT_S, MAX_WAIT_S = 0.005, 0.5
_CONFLICTS = ("database is locked", "conflict", "could not serialize", "busy")
CRASH_ENV = "PROXAUDIT_CRASH"
"""Fault injection for tests: `before-commit:NAME` or `after-commit:NAME` (NAME a file's name: the commit
of the group that holds it; or `derived` for a run's findings and intervals) makes the writer die there
(os._exit, as a kill -9)."""


class Rollback(Exception):
    """Raised by a transaction's work to end it without a change; `value` is what `committed` returns."""

    def __init__(self, value: object) -> None:
        super().__init__()
        self.value = value


def is_conflict(error: duckdb.Error) -> bool:
    """Did the commit fail because another writer committed first?"""
    text = str(error).lower()
    return any(what in text for what in _CONFLICTS)


def crash_point(phase: str, names: tuple[str, ...]) -> None:
    """Die here, as a kill -9 would, when `CRASH_ENV` names this phase and one of the names (tests only)."""
    if os.environ.get(CRASH_ENV) in {f"{phase}:{name}" for name in names}:
        os._exit(70)


def committed(con: duckdb.DuckDBPyConnection, work: Callable[[], T], name: str | tuple[str, ...] = "") -> T:
    """`work()` in one transaction, committed; run again (after a short random wait) while the commit
    conflicts with another writer's. `work` may raise `Rollback(value)` to end without a change. `name`
    says what it commits (the names of a group's files)."""
    names = (name,) if isinstance(name, str) else name
    wait = FIRST_WAIT_S
    for _ in range(MAX_TRIES):
        con.execute("BEGIN TRANSACTION")
        try:
            result = work()
            crash_point("before-commit", names)
            con.execute("COMMIT")
            crash_point("after-commit", names)
            return result
        except Rollback as stop:
            con.execute("ROLLBACK")
            return stop.value
        except duckdb.Error as error:
            _rollback(con)
            if not is_conflict(error):
                raise
        except BaseException:
            _rollback(con)
            raise
        time.sleep(wait * (0.5 + random.random()))
        wait = min(2 * wait, MAX_WAIT_S)
    raise StoreError(
        f"gave up committing {', '.join(names) or 'a change'} after {MAX_TRIES} conflicts with other writers"
    )


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    """Roll back if a transaction is still open (a failed COMMIT has already ended it)."""
    with contextlib.suppress(duckdb.TransactionException):
        con.execute("ROLLBACK")
