"""The store's files beside it: the writer's lock and working copy, and the atomic publish of that copy."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from evaluator.errors import StoreError


def sibling(db: Path, suffix: str) -> Path:
    """A hidden file beside the store: `.metrics.duckdb.lock`, `.metrics.duckdb.work`, ..."""
    return db.with_name(f".{db.name}.{suffix}")


def publish_copy(work: Path, db: Path) -> None:
    """Make a copy of `work` the file `db` atomically: copy it beside `db` (`.DB.publish-PID`), fsync,
    rename over `db`, fsync the folder so that the rename survives a power loss. A reader opening `db`
    sees the old file or the new one, never a part."""
    staged = sibling(db, f"publish-{os.getpid()}")
    try:
        with open(work, "rb") as source, open(staged, "wb") as sink:
            shutil.copyfileobj(source, sink, 1 << 22)
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(staged, db)
    finally:
        staged.unlink(missing_ok=True)
    folder = os.open(db.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


@contextmanager
def writing(db: Path, what: str) -> Iterator[None]:
    """A `StoreError` naming the store and the file for an error of the file system while writing it (a
    read-only folder, a path under /proc, a full disk) instead of a traceback."""
    try:
        yield
    except (OSError, duckdb.IOException) as error:
        why = f"{error.strerror} ({error.filename})" if isinstance(error, OSError) else str(error)
        raise StoreError(f"--db {db}: {what}: {why}") from None
