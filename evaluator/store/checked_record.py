"""The snapshot up to which a store's values were checked, kept on disk for the next process of this program:
a `gate`, `summary` or `replay` after another reads only the rows committed since (`checks.check_values`).

A record lives in the user's cache folder (`PROXAUDIT_CACHE_DIR`, else the platform's user cache folder for
proxaudit), never in the store: whoever can craft a store could craft a record beside it. It names the
store's key (a folder store's path and catalog inode; a catalog URL) and the checked snapshot's id and
commit time, and it is trusted only where the store's snapshot of that id was committed at that time: a
store made anew at the path (whose catalog may reuse the inode) or one whose history was expired is
checked whole. A record that cannot be read or written is as if absent."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import duckdb
import platformdirs

from evaluator.duck import literal

CACHE_DIR_VARIABLE = "PROXAUDIT_CACHE_DIR"
RECORDS_KEPT = 256
"""The records kept (the most recently written): one per store this user's processes checked."""
_ON_DISK: dict[Path, int] = {}
"""The snapshot of each record this process wrote, or read and trusted: not written again."""


def _folder() -> Path:
    return Path(os.environ.get(CACHE_DIR_VARIABLE) or platformdirs.user_cache_dir("proxaudit")) / "checked"


def _path(key: str) -> Path:
    return _folder() / f"{hashlib.blake2b(key.encode(), digest_size=16).hexdigest()}.json"


def _committed_at(con: duckdb.DuckDBPyConnection, catalog: str, snapshot: int) -> str | None:
    """When the store's snapshot `snapshot` was committed (None: no such snapshot, or expired)."""
    sql = (
        f"SELECT CAST(snapshot_time AS VARCHAR) FROM ducklake_snapshots({literal(catalog)}) "
        f"WHERE snapshot_id = {literal(snapshot)}"
    )
    row = con.execute(sql).fetchone()
    return row[0] if row else None


def recorded(con: duckdb.DuckDBPyConnection, key: str, catalog: str) -> int | None:
    """The snapshot a record says the store of `key` was checked up to, if the store attached as `catalog`
    committed a snapshot of that id at the recorded time."""
    path = _path(key)
    try:
        record = json.loads(path.read_text())
        snapshot, at = record["snapshot"], record["committed_at"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if record.get("key") != key or type(snapshot) is not int or not isinstance(at, str):
        return None
    if _committed_at(con, catalog, snapshot) != at:
        return None
    _ON_DISK[path] = snapshot
    return snapshot


def record(con: duckdb.DuckDBPyConnection, key: str, catalog: str, snapshot: int) -> None:
    """Record that the store of `key` (attached as `catalog`) was checked up to `snapshot` (unless this
    process wrote or trusted that record already); the oldest records beyond `RECORDS_KEPT` are removed."""
    path = _path(key)
    at = None if _ON_DISK.get(path) == snapshot else _committed_at(con, catalog, snapshot)
    if at is None:
        return
    text = json.dumps({"key": key, "snapshot": snapshot, "committed_at": at})
    folder = _folder()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, staged = tempfile.mkstemp(dir=folder, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(handle, "w") as out:
                out.write(text)
            os.replace(staged, path)
        except BaseException:
            Path(staged).unlink(missing_ok=True)
            raise
        records = sorted(folder.glob("*.json"), key=_modified)
        for old in records[: max(0, len(records) - RECORDS_KEPT)]:
            old.unlink(missing_ok=True)
    except OSError:
        return
    _ON_DISK[path] = snapshot


def _modified(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0
