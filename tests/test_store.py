"""The metrics store (a DuckLake folder): opening, versioning, digests, one commit per file, snapshots, the
public views' columns, extensions loaded by path only, compaction and converting an old store."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from evaluator.errors import StoreError
from evaluator.logio import write_log_atomic
from evaluator.replay.pipeline import check_and_summarise, replay
from evaluator.store import StoreWriter, connect_store, file_digest, open_store
from evaluator.store.checks import snapshot_id
from evaluator.store.group import file_id_of
from evaluator.store.maintenance import WATCHED_TABLES, compact, convert, merge_small_files
from evaluator.store.reader import ingested_files, stored_max_staleness, version_stamp
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps
from schemas.store import METRICS, PUBLIC_VIEWS

OLD_STORES = {v: Path(__file__).parent / "data" / f"store-v{v}.duckdb.gz" for v in ("5", "6")}
"""Single-file stores of schema version 5 (proxaudit at 1ab5605) and 6 (at 978ced2, with the newer losses'
metrics) of one toy log: see tests/data/README.md."""


@pytest.fixture
def log(tmp_path) -> Path:
    spec = SyntheticSpec(run_id="r", tokens_per_step=512, mean_length=16)
    return write_log_atomic(synthetic_steps(spec, 0, 4), tmp_path / "log.parquet")


def logs(tmp_path: Path, n: int) -> list[Path]:
    spec = SyntheticSpec(run_id="r", tokens_per_step=512, mean_length=16)
    return [write_log_atomic(synthetic_steps(spec, 2 * i, 2), tmp_path / f"{i}.parquet") for i in range(n)]


def old_store(tmp_path: Path, version: str = "5") -> Path:
    path = tmp_path / "old.duckdb"
    path.write_bytes(gzip.decompress(OLD_STORES[version].read_bytes()))
    return path


def test_reading_a_missing_store_is_an_error(tmp_path):
    with pytest.raises(StoreError, match="no metrics store"), open_store(tmp_path / "none"):
        pass
    assert not (tmp_path / "none").exists()


def test_an_old_single_file_store_says_how_to_convert_it(tmp_path):
    old = old_store(tmp_path)
    for use in (open_store, StoreWriter):
        with pytest.raises(StoreError, match=f"proxaudit store convert {old} NEW_FOLDER"), use(old):
            pass


@pytest.mark.parametrize("head, what", [(b"PAR1" + b"\0" * 12, "a Parquet file"), (b"hello", "not a store")])
def test_a_file_is_not_a_store(tmp_path, head, what):
    (tmp_path / "junk").write_bytes(head)
    with pytest.raises(StoreError, match=what), open_store(tmp_path / "junk"):
        pass


def test_a_foreign_lake_is_not_a_store(tmp_path):
    with StoreWriter(tmp_path / "m"):
        pass
    with connect_store(tmp_path / "m", read_only=False) as con:
        con.execute("DROP TABLE store_meta")
    with pytest.raises(StoreError, match="not a proxaudit metrics store"), open_store(tmp_path / "m"):
        pass


def test_public_views_have_the_documented_columns(tmp_path):
    with StoreWriter(tmp_path / "m"):
        pass
    assert sorted(os.listdir(tmp_path / "m")) >= ["catalog.sqlite", "data"]
    with open_store(tmp_path / "m") as con:
        for view, columns in PUBLIC_VIEWS.items():
            assert tuple(con.execute(f"SELECT * FROM {view} LIMIT 0").df().columns) == columns


def test_a_users_duckdb_reads_the_store_with_the_documented_attach(tmp_path, log):
    """README's lines: LOAD the two extensions by path, ATTACH, USE; the views are the store's own."""
    replay([log], tmp_path / "m", progress=False)
    site = Path(duckdb.__file__).parents[1]
    with duckdb.connect(config={"autoinstall_known_extensions": False}) as con:
        for name in ("sqlite_scanner", "ducklake"):
            binary = f"extensions/v{duckdb.__version__}/{name}.duckdb_extension"
            con.execute(f"LOAD '{site}/duckdb_extension_{name}/{binary}'")
        con.execute(f"ATTACH 'ducklake:sqlite:{tmp_path}/m/catalog.sqlite' AS store (READ_ONLY); USE store")
        got = con.execute("SELECT count(*), sum(n) FROM run_summary").fetchone()
    with open_store(tmp_path / "m") as con:
        assert con.execute("SELECT count(*), sum(n) FROM run_summary").fetchone() == got and got[0] > 0


def test_digest_is_of_the_bytes(tmp_path, log):
    copy = tmp_path / "copy.parquet"
    copy.write_bytes(log.read_bytes())
    assert file_digest(copy) == file_digest(log) and len(file_digest(log)) == 64
    copy.write_bytes(log.read_bytes() + b"\0")
    assert file_digest(copy) != file_digest(log)


def test_ingest_is_once_per_digest(tmp_path, log):
    done = check_and_summarise(log)
    db, digest, summary, sequences = (
        tmp_path / "m",
        file_digest(log),
        done.summary,
        done.checked.facts.sequences,
    )
    with StoreWriter(db) as store:
        assert store.digests() == {}
        assert store.ingest(log, digest, summary, sequences, done.checked.evidence) is True
        assert store.ingest(log, digest, summary, sequences) is False
        assert store.digests() == {digest: str(log.resolve())}
    with open_store(db) as con:
        rows = con.execute("SELECT file_id, path, n_rows, n_tokens FROM ingested_file").fetchall()
        assert rows == [(int(digest[:15], 16), str(log.resolve()), summary.n_rows, summary.n_tokens)]
        assert file_id_of(digest) == rows[0][0]
        n = con.execute("SELECT sum(n_tokens) FROM file_tokens").fetchall()[0][0]
        assert n == summary.n_tokens
        names = {n for (n,) in con.execute("SELECT name FROM file_evidence").fetchall()}
        assert names == {*done.checked.evidence.tables, "examples"}


def test_a_failed_insert_leaves_nothing(tmp_path, log, monkeypatch):
    done = check_and_summarise(log)
    db, summary = tmp_path / "m", done.summary
    broken = summary.sketch_by_step.drop_columns(["bucket"])  # the last-but-one insert fails
    monkeypatch.setattr(summary, "sketch_by_step", broken)
    with pytest.raises(duckdb.Error), StoreWriter(db) as store:
        store.ingest(log, file_digest(log), summary, done.checked.facts.sequences)
    with open_store(db) as con:
        for table in ("ingested_file", "file_sequences", "file_tokens", "metric_moments", "sketch_by_step"):
            assert con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0] == 0, table


def test_each_file_is_one_snapshot_and_old_snapshots_stay_readable(tmp_path):
    """A reader opened before a commit keeps its snapshot; a new one sees the commit; `version` reads an
    older snapshot (time travel), and each ingested file added exactly one snapshot. The version stamp (the
    dashboard's cache key) changes with a commit, not with a reader opening the store."""
    first, second = logs(tmp_path, 2)
    db = tmp_path / "m"
    replay([first], db, progress=False, workers=1)
    stamp = version_stamp(db)
    count = "SELECT count(*) FROM ingested_file"
    with open_store(db) as before:
        at = snapshot_id(before)
        assert version_stamp(db) == stamp
        replay([second], db, progress=False, workers=1)
        assert version_stamp(db) != stamp
        with open_store(db) as after:
            assert after.execute(count).fetchone()[0] == 2
            assert {d for d, _ in ingested_files(after)} == {file_digest(first), file_digest(second)}
            assert snapshot_id(after) == at + 2  # the file's commit, then the run's derived rows
            with pytest.raises(duckdb.PermissionException):
                after.execute(f"SELECT * FROM read_parquet('{first}')").fetchall()
        assert before.execute(count).fetchone()[0] == 1
    with open_store(db, version=at) as past:
        assert past.execute(count).fetchone()[0] == 1 and snapshot_id(past) == at


def test_no_extension_is_downloaded(tmp_path, log):
    """Every connection has auto-install off and loads the extensions from their pip packages: a replay
    and a query with an empty home (where DuckDB would install downloads) leave nothing there."""
    home = tmp_path / "home"
    home.mkdir()
    code = (
        "import sys; from evaluator.replay import replay; from evaluator.verdict.query import query_table;"
        "replay([sys.argv[1]], sys.argv[2], progress=False, workers=1);"
        "print(query_table(sys.argv[2], 'SELECT current_setting(\\'autoinstall_known_extensions\\') AS a'))"
    )
    env = {
        **os.environ,
        "HOME": str(home),
        "http_proxy": "http://127.0.0.1:9",
        "https_proxy": "http://127.0.0.1:9",
    }
    done = subprocess.run([sys.executable, "-c", code, str(log), str(tmp_path / "m")], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "False" in done.stdout or "false" in done.stdout
    assert not any(home.rglob("*.duckdb_extension")), list(home.rglob("*"))


def test_compaction_merges_files_and_keeps_every_row(tmp_path):
    db = tmp_path / "m"
    replay(logs(tmp_path, 4), db, progress=False, workers=1)
    view = "SELECT * FROM step_summary ORDER BY ALL"
    with open_store(db) as con:
        before = con.execute(view).fetchall()
    done = compact(db, expire_older_than_h=0, orphan_age_h=0)
    assert done.files_after < done.files_before
    with open_store(db) as con:
        assert con.execute(view).fetchall() == before
    meta = "__ducklake_metadata_store"
    with connect_store(db) as con:
        files = f"SELECT path FROM {meta}.ducklake_data_file"
        known = con.execute(f"{files} UNION ALL SELECT path FROM {meta}.ducklake_delete_file").fetchall()
    on_disk = {p.name for p in (db / "data").rglob("*.parquet")}
    assert on_disk <= {p for (p,) in known} and len(on_disk) < done.files_before  # no file left untracked


def test_merging_small_files_leaves_one_file_a_table_the_same_rows_and_every_snapshot(tmp_path):
    """What a look of `watch` merges now and then: the per-file tables it reads, one Parquet file each after
    (one per ingested file before), every row and every earlier snapshot as they were."""
    db, meta = tmp_path / "m", "__ducklake_metadata_store"
    for log in logs(tmp_path, 4):  # a commit each, as watch's looks make them
        replay([log], db, progress=False, workers=1)
    live = (
        f"SELECT t.table_name, count(*) FROM {meta}.ducklake_data_file d JOIN {meta}.ducklake_table t "
        "USING (table_id) WHERE d.end_snapshot IS NULL AND t.end_snapshot IS NULL GROUP BY ALL"
    )
    rows = {t: f"SELECT * FROM {t} ORDER BY ALL" for t in WATCHED_TABLES}
    with connect_store(db) as con:
        assert all(dict(con.execute(live).fetchall())[t] == 4 for t in WATCHED_TABLES)
        before, then = {t: con.execute(sql).fetchall() for t, sql in rows.items()}, snapshot_id(con)
        earlier = f"SELECT count(*) FROM metric_moments AT (VERSION => {then - 1})"  # 3 files' rows
        at_then = con.execute(earlier).fetchone()
    assert merge_small_files(db) == len(WATCHED_TABLES)
    with connect_store(db) as con:
        files = dict(con.execute(live).fetchall())
        assert all(files[t] == 1 for t in WATCHED_TABLES) and files["sketch_by_step"] == 4  # the others left
        assert {t: con.execute(sql).fetchall() for t, sql in rows.items()} == before
        assert con.execute(earlier).fetchone() == at_then
    assert merge_small_files(db) == 0  # nothing left to merge


@pytest.mark.parametrize("version", ["5", "6"])
def test_an_old_store_converts_with_its_numbers(tmp_path, version):
    """Every row of the metrics this proxaudit computes, as the old store's own views gave them; version 5's
    `is_weight_clamped` (verl's clamp to [1/T, T], replaced by its truncation) is the only row left out."""
    old = old_store(tmp_path, version)
    assert convert(old, tmp_path / "new") == 1
    views = {
        v: f"SELECT * FROM {v} WHERE metric IN (SELECT unnest($known)) ORDER BY ALL"
        for v in ("run_summary", "step_summary", "staleness_summary")
    }
    with duckdb.connect(str(old), read_only=True) as was, open_store(tmp_path / "new") as now:
        for view, sql in views.items():
            got, expected = (c.execute(sql, {"known": list(METRICS)}).df() for c in (now, was))
            pd.testing.assert_frame_equal(got, expected, rtol=1e-12, obj=view)
        metrics = "SELECT DISTINCT metric FROM metric_moments"
        left_out = {m for (m,) in was.execute(metrics).fetchall()} - set(METRICS)
        assert left_out == ({"is_weight_clamped"} if version == "5" else set())
        assert {m for (m,) in now.execute(metrics).fetchall()} <= set(METRICS)
        for table in ("run_finding", "run_check"):
            stamp = "found_at" if table == "run_finding" else "checked_at"
            sql = f"SELECT * EXCLUDE ({stamp}) FROM {table} ORDER BY ALL"
            assert now.execute(sql).fetchall() == was.execute(sql).fetchall()
    with pytest.raises(StoreError, match="already holds a store"):
        convert(old, tmp_path / "new")


def test_an_old_store_converts_with_the_trainer_s_maximum_staleness_it_recorded(tmp_path):
    """A version-5 store of a replay told the trainer's maximum staleness (`store_meta` key `max_staleness`):
    the gate of the converted store judges up to the same S."""
    old, recorded = old_store(tmp_path), ("--max-staleness 3 given to replay", "max_head_offpolicyness")
    entry = json.dumps({"value": 3, "source": recorded[0], "key": recorded[1]})
    with duckdb.connect(str(old)) as con:  # as the single-file store's writer recorded it
        con.execute("INSERT INTO store_meta VALUES ('max_staleness', ?)", [entry])
    convert(old, tmp_path / "new")
    with open_store(tmp_path / "new") as con:
        assert stored_max_staleness(con) == (3, *recorded)


def test_a_store_folder_copied_or_moved_whole_reads_and_writes_its_own_files(tmp_path):
    """`cp -r` and `mv` of a store folder: the copy reads its own Parquet files (the original moved away),
    and a replay into the copy writes into the copy's data/ only."""
    first, second = logs(tmp_path, 2)
    replay([first], tmp_path / "a", progress=False, workers=1)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    (tmp_path / "a").rename(tmp_path / "moved")

    def rows(db: Path) -> dict[str, list[tuple]]:
        with open_store(db) as con:
            return {
                t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall()
                for t in ("ingested_file", "metric_moments")
            }

    assert rows(tmp_path / "b") == rows(tmp_path / "moved")
    before = sorted((tmp_path / "moved").rglob("*"))
    replay([second], tmp_path / "b", progress=False, workers=1)
    assert sorted((tmp_path / "moved").rglob("*")) == before
    assert (
        len(rows(tmp_path / "b")["ingested_file"]) == 2
        and len(rows(tmp_path / "moved")["ingested_file"]) == 1
    )
    with pytest.raises(StoreError, match="own data/ folder"):
        StoreWriter(tmp_path / "c", data_path=str(tmp_path / "elsewhere"))
