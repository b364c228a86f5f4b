"""The value checks a store's readers and writers run (`evaluator.store.checks`) read each row once in a
process: the rows this process's writer committed right after a checked snapshot count as checked, another
writer's rows between are read; watch hands the snapshot a look checked to the next look, in a fresh
process, which then reads only what came after it; and a record in the user's cache folder
(`evaluator.store.checked_record`) does the same for any later process, trusted only where the store's
snapshot of that id was committed at the recorded time."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from evaluator.errors import StoreError
from evaluator.formulas.loss import DEFAULT_LOSS
from evaluator.logio import write_log_atomic
from evaluator.replay.pipeline import replay
from evaluator.store import checks, connect_store, open_store
from evaluator.store.checked_record import CACHE_DIR_VARIABLE
from evaluator.store.checks import checked_up_to, snapshot_id
from evaluator.store.lake import locate
from evaluator.store.writer import StoreWriter
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps
from evaluator.watch.completeness import Entry
from evaluator.watch.look import Look

LONG_RUN_ID = "repeat('x', 300)"  # longer than a run_id may be: a crafted store's value


@pytest.fixture
def fresh_process(monkeypatch, tmp_path):
    """Nothing checked yet, as in a new process of a user who never ran proxaudit."""
    monkeypatch.setattr(checks, "_CHECKED", {})
    monkeypatch.setattr(checks, "_SOUND", {})
    monkeypatch.setenv(CACHE_DIR_VARIABLE, str(tmp_path / "cache"))


def log(folder: Path, first_step: int) -> Path:
    spec = SyntheticSpec(run_id="r", seed=3, tokens_per_step=512, mean_length=16)
    return write_log_atomic(synthetic_steps(spec, first_step, 2), folder / f"r-{first_step:03d}.parquet")


def snapshot(db: Path) -> int:
    with connect_store(db) as con:
        return snapshot_id(con)


def craft(db: Path) -> None:
    """Another program's commit: a run_id no replay writes."""
    with connect_store(db, read_only=False) as con:
        one = "rowid IN (SELECT rowid FROM file_tokens LIMIT 1)"
        con.execute(f"UPDATE file_tokens SET run_id = {LONG_RUN_ID} WHERE {one}")


def check(db: Path) -> None:
    with open_store(db):  # its value checks
        pass


def test_a_writer_s_own_commits_count_as_checked_another_writer_s_between_are_read(tmp_path, fresh_process):
    db = tmp_path / "store"
    replay([log(tmp_path, 0)], db, progress=False, workers=1)
    check(db)
    replay([log(tmp_path, 2)], db, progress=False, workers=1)
    assert checked_up_to(locate(db))[1] == snapshot(db)  # its commits followed the checked snapshot

    with StoreWriter(db) as writer:  # checked at open
        craft(db)  # commits between the check and the writer's own commit
        writer.record_max_staleness(3, "test", "max_staleness")
    assert checked_up_to(locate(db))[1] < snapshot(db) - 1
    with pytest.raises(StoreError, match="file_tokens.run_id are longer than"):
        check(db)


def test_a_writer_s_commit_of_nothing_never_counts_another_s_snapshot_as_checked(tmp_path, fresh_process):
    db = tmp_path / "store"
    replay([log(tmp_path, 0)], db, progress=False, workers=1)
    with StoreWriter(db) as writer:  # checked at open
        writer.record_max_staleness(3, "test", "max_staleness")  # its own commit, counted as checked
        own = snapshot(db)
        assert checked_up_to(locate(db))[1] == own
        craft(db)  # the next snapshot, another writer's
        writer.record_max_staleness(3, "test", "max_staleness")  # the same again: nothing to commit
    assert checked_up_to(locate(db))[1] == own < snapshot(db)
    with pytest.raises(StoreError, match="file_tokens.run_id are longer than"):
        check(db)


def test_a_store_s_tables_are_read_once_per_snapshot(tmp_path, fresh_process, monkeypatch):
    """Its tables and columns are checked at a snapshot this process has not found sound (nor checked
    whole, nor an earlier process by its record), and again after any commit: another program's DDL is
    refused."""
    db = tmp_path / "store"
    replay([log(tmp_path, 0)], db, progress=False, workers=1)
    monkeypatch.setenv(CACHE_DIR_VARIABLE, str(tmp_path / "another cache"))  # a process that never saw it
    monkeypatch.setattr(checks, "_CHECKED", {})
    read: list[int] = []
    real = checks.check_tables
    monkeypatch.setattr(checks, "check_tables", lambda *args: read.append(snapshot(db)) or real(*args))
    for _ in range(3):
        check(db)  # a new connection's check and its transaction's, then the pooled connection's
    with StoreWriter(db):
        pass
    assert read == [snapshot(db)]

    with connect_store(db, read_only=False) as con:
        con.execute("ALTER TABLE run_check ADD COLUMN note VARCHAR")
    with pytest.raises(StoreError, match="table run_check is of other columns"):
        check(db)
    with connect_store(db, read_only=False) as con:
        con.execute("ALTER TABLE run_check DROP COLUMN note")
    check(db)
    assert read == [snapshot(db) - 2, snapshot(db) - 1, snapshot(db)]

    monkeypatch.setattr(checks, "_CHECKED", {})  # a later process: it trusts the record of the snapshot
    monkeypatch.setattr(checks, "_SOUND", {})
    check(db)
    assert len(read) == 3


def look(path: Path, db: Path, checked: tuple[str, int] | None) -> Look:
    stat = path.stat()
    entry = Entry(path, stat.st_size, stat.st_mtime_ns)
    return Look((entry,), str(db), None, DEFAULT_LOSS, None, None, 1.0, judge=True, checked=checked)


def test_a_look_reads_only_the_rows_after_the_snapshot_an_earlier_look_checked(tmp_path, monkeypatch):
    db = tmp_path / "store"
    monkeypatch.setattr(checks, "_CHECKED", {})
    first = look(log(tmp_path, 0), db, None).run()
    assert first.error is None and first.checked == checked_up_to(locate(db))
    assert first.checked[1] == snapshot(db)

    craft(db)  # before the snapshot the next look is handed: as if that look had checked it
    handed = (first.checked[0], snapshot(db))
    monkeypatch.setattr(checks, "_CHECKED", {})  # the next look's process
    second = look(log(tmp_path, 2), db, handed).run()
    assert second.error is None and second.checked[1] == snapshot(db) > handed[1]

    craft(db)  # after it: read and refused
    monkeypatch.setattr(checks, "_CHECKED", {})
    third = look(log(tmp_path, 4), db, second.checked).run()
    assert isinstance(third.error, StoreError) and "file_tokens.run_id are longer than" in str(third.error)


def records(tmp_path: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in (tmp_path / "cache" / "checked").glob("*.json")]


def committed_at(db: Path, snapshot: int) -> str:
    """The commit time DuckLake's catalog holds for a snapshot, read from the SQLite catalog itself."""
    with sqlite3.connect(db / "catalog.sqlite") as con:
        sql = "SELECT snapshot_time FROM ducklake_snapshot WHERE snapshot_id = ?"
        return con.execute(sql, [snapshot]).fetchone()[0]


def test_a_new_store_s_writer_records_its_own_rows_as_checked(tmp_path, fresh_process):
    db = tmp_path / "store"
    replay([log(tmp_path, 0)], db, progress=False, workers=1)
    assert checked_up_to(locate(db))[1] == snapshot(db)  # every row of the store its own
    (written,) = records(tmp_path)
    assert written["key"] == checked_up_to(locate(db))[0] and written["snapshot"] == snapshot(db)
    assert written["committed_at"].removesuffix("+00") == committed_at(db, snapshot(db)).removesuffix("+00")


def test_a_record_is_written_once_per_snapshot(tmp_path, fresh_process):
    """A writer that commits nothing, and readers of the snapshot recorded, leave its record as it is (the
    file is replaced whenever it is written: its inode says whether it was)."""
    db = tmp_path / "store"
    replay([log(tmp_path, 0)], db, progress=False, workers=1)
    (path,) = (tmp_path / "cache" / "checked").glob("*.json")
    inode = path.stat().st_ino
    with StoreWriter(db):
        pass
    check(db)
    assert path.stat().st_ino == inode
    replay([log(tmp_path, 4)], db, progress=False, workers=1)
    assert path.stat().st_ino != inode and records(tmp_path)[0]["snapshot"] == snapshot(db)


def write_record(tmp_path: Path, db: Path, snapshot: int, at: str | None = None) -> None:
    """A record, as a process that checked `db` up to `snapshot` writes it (`at`: another commit time)."""
    (path,) = (tmp_path / "cache" / "checked").glob("*.json")
    key = json.loads(path.read_text())["key"]
    with connect_store(db) as con:
        if at is None:
            checks.checked_record.record(con, key, "store", snapshot)
        else:
            path.write_text(json.dumps({"key": key, "snapshot": snapshot, "committed_at": at}))


def test_a_later_process_reads_only_the_rows_committed_after_the_recorded_snapshot(
    tmp_path, fresh_process, monkeypatch
):
    db = tmp_path / "store"
    replay([log(tmp_path, 0)], db, progress=False, workers=1)
    craft(db)  # before the recorded snapshot: as if a process had checked it
    write_record(tmp_path, db, snapshot(db))
    monkeypatch.setattr(checks, "_CHECKED", {})  # a later process
    check(db)
    assert checked_up_to(locate(db))[1] == snapshot(db)

    craft(db)  # after it: read and refused
    monkeypatch.setattr(checks, "_CHECKED", {})
    with pytest.raises(StoreError, match="file_tokens.run_id are longer than"):
        check(db)


@pytest.mark.parametrize("record", ["another commit time", "not JSON", "no snapshot"])
def test_a_record_the_store_does_not_bear_out_is_ignored(tmp_path, fresh_process, monkeypatch, record):
    """A record of another store once at the path (the same key: a catalog's inode reused), or one that
    cannot be read: the store is checked whole."""
    db = tmp_path / "store"
    replay([log(tmp_path, 0)], db, progress=False, workers=1)
    craft(db)
    if record == "another commit time":
        write_record(tmp_path, db, snapshot(db), at="2026-01-01 00:00:00+00")
    else:
        (path,) = (tmp_path / "cache" / "checked").glob("*.json")
        path.write_text(
            "{" if record == "not JSON" else json.dumps({"key": json.loads(path.read_text())["key"]})
        )
    monkeypatch.setattr(checks, "_CHECKED", {})
    with pytest.raises(StoreError, match="file_tokens.run_id are longer than"):
        check(db)


def test_a_reader_of_an_older_snapshot_leaves_the_later_one_checked(tmp_path, fresh_process):
    """A reader at an earlier snapshot (the dashboard's history) checks what it reads, and the later
    snapshot stays the one checked up to, in this process and on disk."""
    db = tmp_path / "store"
    replay([log(tmp_path, 0)], db, progress=False, workers=1)
    older = snapshot(db)
    replay([log(tmp_path, 2)], db, progress=False, workers=1)
    latest = snapshot(db)
    check(db)
    with open_store(db, version=older) as con:
        assert snapshot_id(con) == older
    assert checked_up_to(locate(db))[1] == latest
    assert [r["snapshot"] for r in records(tmp_path)] == [latest]
