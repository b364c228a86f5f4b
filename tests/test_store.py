"""The metrics store: opening, versioning, digests, atomic ingest and the public views' columns."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from evaluator.errors import StoreError
from evaluator.logio import write_log_atomic
from evaluator.replay.pipeline import check_and_summarise, replay
from evaluator.store import StoreWriter, file_digest, open_store
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps
from schemas.store import PUBLIC_VIEWS


@pytest.fixture
def log(tmp_path) -> Path:
    spec = SyntheticSpec(run_id="r", tokens_per_step=512, mean_length=16)
    return write_log_atomic(synthetic_steps(spec, 0, 4), tmp_path / "log.parquet")


def test_reading_a_missing_store_is_an_error(tmp_path):
    with pytest.raises(StoreError, match="no metrics database"), open_store(tmp_path / "none.duckdb"):
        pass
    assert not (tmp_path / "none.duckdb").exists()


def test_a_foreign_duckdb_file_is_not_a_store(tmp_path):
    con = duckdb.connect(str(tmp_path / "other.duckdb"))
    con.execute("CREATE TABLE t (x INTEGER)")
    con.close()
    with (
        pytest.raises(StoreError, match="not a proxaudit metrics database"),
        open_store(tmp_path / "other.duckdb"),
    ):
        pass


def test_a_non_duckdb_file_is_an_error(tmp_path):
    (tmp_path / "junk.duckdb").write_bytes(b"hello")
    with pytest.raises(StoreError), open_store(tmp_path / "junk.duckdb"):
        pass


def test_public_views_have_the_documented_columns(tmp_path):
    with StoreWriter(tmp_path / "m.duckdb"):
        pass
    with open_store(tmp_path / "m.duckdb") as con:
        for view, columns in PUBLIC_VIEWS.items():
            assert tuple(con.execute(f"SELECT * FROM {view} LIMIT 0").df().columns) == columns


def test_digest_is_of_the_bytes(tmp_path, log):
    copy = tmp_path / "copy.parquet"
    copy.write_bytes(log.read_bytes())
    assert file_digest(copy) == file_digest(log) and len(file_digest(log)) == 64
    copy.write_bytes(log.read_bytes() + b"\0")
    assert file_digest(copy) != file_digest(log)


def test_ingest_is_once_per_digest(tmp_path, log):
    done = check_and_summarise(log)
    db, digest, summary, sequences = (
        tmp_path / "m.duckdb",
        file_digest(log),
        done.summary,
        done.checked.facts.sequences,
    )
    with StoreWriter(db) as store:
        assert store.digests() == {}
        assert store.ingest(log, digest, summary, sequences) is True
        assert store.ingest(log, digest, summary, sequences) is False
        assert store.digests() == {digest: str(log.resolve())}
    with open_store(db) as con:
        rows = con.execute("SELECT file_id, path, n_rows, n_tokens FROM ingested_file").fetchall()
        assert rows == [(1, str(log.resolve()), summary.n_rows, summary.n_tokens)]
        n = con.execute("SELECT sum(n_tokens) FROM file_tokens").fetchall()[0][0]
        assert n == summary.n_tokens


def test_a_failed_insert_leaves_nothing(tmp_path, log, monkeypatch):
    done = check_and_summarise(log)
    db, summary = tmp_path / "m.duckdb", done.summary
    broken = summary.sketch_by_step.drop_columns(["bucket"])  # the last-but-one insert fails
    monkeypatch.setattr(summary, "sketch_by_step", broken)
    with pytest.raises(duckdb.Error), StoreWriter(db) as store:
        store.ingest(log, file_digest(log), summary, done.checked.facts.sequences)
    with open_store(db) as con:
        for table in ("ingested_file", "file_sequences", "file_tokens", "metric_moments", "sketch_by_step"):
            assert con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0] == 0, table


def test_readers_of_one_process_each_see_the_latest_publish(tmp_path):
    """The dashboard's sessions are threads of one process, and a user's notebook may hold its own
    read-only connection: a reader opened while others are open still opens, with file access off, and
    sees the latest publish; one opened before keeps its own whole publish."""
    spec = SyntheticSpec(run_id="r", tokens_per_step=512, mean_length=16)
    logs = [write_log_atomic(synthetic_steps(spec, 4 * i, 4), tmp_path / f"{i}.parquet") for i in (0, 1)]
    db = tmp_path / "m.duckdb"
    replay([logs[0]], db, progress=False)
    count = "SELECT count(*) FROM ingested_file"
    with duckdb.connect(str(db), read_only=True) as raw, open_store(db) as first:
        replay([logs[1]], db, progress=False)  # publishes a new file over the store
        with open_store(db) as second:
            assert second.execute(count).fetchone()[0] == 2
            with pytest.raises(duckdb.PermissionException):
                second.execute(f"SELECT * FROM read_parquet('{logs[0]}')").fetchall()
        assert first.execute(count).fetchone()[0] == raw.execute(count).fetchone()[0] == 1
