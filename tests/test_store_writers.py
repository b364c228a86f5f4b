"""Whole-run state by construction: any sequence of partial, killed, resumed or concurrent replays ends in
the store one clean replay of the same files writes, table by table (timestamps aside); two writers that
take the same file (or the same tokens) at once store it once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest

from evaluator.logio import write_log_atomic
from evaluator.replay.groups import GROUP_FILES
from evaluator.replay.pipeline import check_and_summarise, replay
from evaluator.store import StoreWriter, connect_store, file_digest
from evaluator.store import writer as store_writer
from evaluator.store.checks import expected_tables
from evaluator.store.commits import CRASH_ENV
from evaluator.store.repeats import CopyOf
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps


def write_logs(folder: Path) -> list[Path]:
    """Two runs in four files; run `a` has a finding-worthy shape in none of them (the checks decide)."""
    a = SyntheticSpec(run_id="a", seed=1, tokens_per_step=512, mean_length=16)
    b = SyntheticSpec(run_id="b", seed=2, tokens_per_step=512, mean_length=16, prox_every=2)
    return [
        write_log_atomic(synthetic_steps(a, 0, 3), folder / "a-0.parquet"),
        write_log_atomic(synthetic_steps(a, 3, 3), folder / "a-1.parquet"),
        write_log_atomic(synthetic_steps(a, 6, 3), folder / "a-2.parquet"),
        write_log_atomic(synthetic_steps(b, 0, 4), folder / "b-0.parquet"),
    ]


def tables(db: Path) -> dict[str, pd.DataFrame]:
    """Every table of the store, sorted, its timestamp columns left out."""
    out = {}
    with connect_store(db) as con:
        for table, columns in expected_tables().items():
            kept = [name for name, dtype in columns if not dtype.startswith("TIMESTAMP")]
            sql = f"SELECT {', '.join(kept)} FROM {table} ORDER BY ALL"
            out[table] = con.execute(sql).df()
    return out


def assert_same_store(db: Path, clean: Path) -> None:
    got, want = tables(db), tables(clean)
    for table in want:
        if table == "ingest_ticket":  # how many commits it took: not state
            continue
        pd.testing.assert_frame_equal(got[table], want[table], check_exact=True, obj=table)
    assert want["run_check"].shape[0] > 0 and want["decision_interval"].shape[0] > 0


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("writers")
    logs = write_logs(folder / "logs")
    clean = folder / "clean"
    replay([folder / "logs"], clean, progress=False, workers=1)
    return folder, logs, clean


def cli_replay(
    paths: list[Path], db: Path | str, crash: str | None = None, data_path: Path | None = None, **popen
) -> subprocess.Popen:
    env = {**os.environ, **({CRASH_ENV: crash} if crash else {})}
    command = [sys.executable, "-m", "evaluator.cli", "replay", *map(str, paths), "--db", str(db)]
    command += ["--no-progress", *(["--data-path", str(data_path)] if data_path is not None else [])]
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.Popen(command, env=env, **pipes, **popen)


@pytest.mark.parametrize(
    "crash, stored",
    [("before-commit:setup", None), ("before-commit:a-1.parquet", 0), ("after-commit:a-1.parquet", 4),
     ("before-commit:derived", 4), ("after-commit:derived", 4)],
)  # fmt: skip
def test_killed_at_every_phase_then_resumed_equals_a_clean_replay(setup, tmp_path, crash, stored):
    """A replay process dies at each phase, as a kill -9 would. The four files make one group commit: a
    kill after its files are registered and before its COMMIT (named by its second file) leaves none of
    them stored, one right after it all four (`stored`; the store's making killed: no store to count). A
    resumed replay ingests the files not stored and ends in the clean replay's store."""
    folder, logs, clean = setup
    db = tmp_path / "m"
    crashed = cli_replay(logs, db, crash)
    out, err = crashed.communicate(timeout=300)
    assert crashed.returncode == 70, err  # died there, as a kill -9 would
    if stored is not None:
        with connect_store(db) as con:
            assert con.execute("SELECT count(*) FROM ingested_file").fetchone()[0] == stored
            assert con.execute("SELECT count(DISTINCT file_id) FROM file_sequences").fetchone()[0] == stored
    resumed = replay(logs, db, progress=False, workers=1)
    assert sum(o.status == "ingested" for o in resumed.outcomes) == 4 - (stored or 0)
    assert_same_store(db, clean)


def test_partial_replays_in_any_order_equal_a_clean_replay(setup, tmp_path):
    """Run `a`'s files in two calls, `b`'s before them: the stored findings and intervals of `a` are those
    of all its files, not of the last call's."""
    folder, logs, clean = setup
    db = tmp_path / "m"
    for part in ([logs[3]], [logs[2]], [logs[0], logs[1]]):
        replay(part, db, progress=False, workers=1)
    assert_same_store(db, clean)


def test_a_real_kill_mid_replay_then_resume_equals_a_clean_replay(setup, tmp_path):
    """SIGKILL once the first file is reported committed (wherever the writer then is)."""
    folder, logs, clean = setup
    db = tmp_path / "m"
    first = cli_replay(logs, db, start_new_session=True)
    while ": ingested" not in (line := first.stdout.readline()):
        assert line, first.stderr.read()  # the replay ended without committing a file
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=60)
    replay(logs, db, progress=False, workers=1)
    assert_same_store(db, clean)


def test_concurrent_replays_ingest_each_file_once_and_equal_a_clean_replay(setup, tmp_path):
    """Three replays of the same files at once, in different orders: each file is ingested by exactly one
    of them, the others find it there; the store is the clean replay's."""
    folder, logs, clean = setup
    db = tmp_path / "m"
    orders = [logs, logs[::-1], [logs[2], logs[0], logs[3], logs[1]]]
    writers = [cli_replay(order, db) for order in orders]
    outputs = [w.communicate(timeout=600) for w in writers]
    assert [w.returncode for w in writers] == [0, 0, 0], [err for _, err in outputs]
    for log in logs:
        lines = [line for out, _ in outputs for line in out.splitlines() if line.startswith(f"{log}:")]
        assert sorted(line.split(": ", 1)[1].split(" (")[0] for line in lines) == [
            "already ingested, unchanged",
            "already ingested, unchanged",
            "ingested",
        ], lines
    assert_same_store(db, clean)


def test_a_store_records_its_name_maps_when_made_and_never_again(setup, tmp_path):
    """Every table an ingest registers Parquet files in has its name map from the store's first commit,
    and ingesting records no other: a name map committed while another process loads the maps crashes it
    (duckdb/ducklake#1431), which the concurrent replays above hit under load. The store's data lies in
    its own folder (the staged store's data path rewritten when it moved into place)."""
    folder, logs, clean = setup
    db = tmp_path / "m"
    meta = "__ducklake_metadata_store"
    tables_of = f"JOIN {meta}.ducklake_table t USING (table_id)"
    maps = f"SELECT t.table_name FROM {meta}.ducklake_column_mapping {tables_of}"
    with StoreWriter(db) as writer:
        made = sorted(table for (table,) in writer.con.execute(maps).fetchall())
    replay(logs, db, progress=False, workers=1)
    with connect_store(db) as con:
        after = sorted(table for (table,) in con.execute(maps).fetchall())
        registered = f"SELECT DISTINCT t.table_name FROM {meta}.ducklake_data_file f {tables_of} "
        registered += "WHERE f.path LIKE 'proxaudit-%'"
        tables = sorted(table for (table,) in con.execute(registered).fetchall())
        paths = con.execute(f"SELECT value FROM {meta}.ducklake_metadata WHERE key = 'data_path'").fetchall()
    assert made == after == tables and len(tables) == 5
    assert paths == [(f"{db / 'data'}{os.sep}",)]
    assert not list(tmp_path.glob(".m.new-*")) and not any((db / "data").rglob("*-000000000000000-*"))


def test_two_writers_racing_on_one_file_store_it_once(tmp_path, monkeypatch):
    """Both writers are inside their ingest transaction at once (a barrier after the checks): one
    commits, the other's commit conflicts, runs again and finds the file (same bytes), or the same tokens
    (a re-saved copy)."""
    log = write_logs(tmp_path / "logs")[0]
    resaved = tmp_path / "resaved.parquet"
    import pyarrow.parquet as pq

    pq.write_table(pq.read_table(log), resaved, compression="gzip")
    done = {p: check_and_summarise(p) for p in (log, resaved)}
    barrier, first_calls = threading.Barrier(2, timeout=60), set()
    real_check = store_writer.check

    def check(con, files, db):
        found = real_check(con, files, db)
        if threading.get_ident() not in first_calls:  # only the first try of each writer waits
            first_calls.add(threading.get_ident())
            barrier.wait()
        return found

    monkeypatch.setattr(store_writer, "check", check)
    for second in (log, resaved):
        db = tmp_path / f"m-{second.stem}"
        with StoreWriter(db):
            pass
        barrier.reset()
        first_calls.clear()
        results = {}

        def ingest(path: Path, db: Path, results: dict) -> None:
            with StoreWriter(db) as writer:
                r = done[path]
                results[path.name + str(threading.get_ident())] = writer.ingest(
                    path, file_digest(path), r.summary, r.checked.facts.sequences, r.checked.evidence
                )

        threads = [threading.Thread(target=ingest, args=(p, db, results)) for p in (log, second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        outcomes = sorted(results.values(), key=repr)
        expected_other = False if second == log else CopyOf
        assert outcomes.count(True) == 1, outcomes
        other = [o for o in outcomes if o is not True][0]
        assert other is False if expected_other is False else isinstance(other, CopyOf), outcomes
        with connect_store(db) as con:
            assert con.execute("SELECT count(*) FROM ingested_file").fetchone()[0] == 1
            n = con.execute("SELECT sum(n_tokens) FROM file_tokens").fetchone()[0]
        assert n == done[log].summary.n_tokens


def test_a_finding_zoo_s_columns_evidence_decides_survives_a_resumed_replay(tmp_path):
    """logp_low_precision reads the `columns` table of the evidence alone (issue 35's per-column counts). A
    replay killed after committing the first of three files, resumed with the other two: the run's
    finding counts the first file's log-probs too (its `columns` evidence, stored with it), and the store
    is a clean replay's."""
    from tests.test_findings import found
    from tests.zoo.bases import base
    from tests.zoo.kinds_logp import _behave_bf16

    logs = tmp_path / "logs"
    planted = _behave_bf16(base("smollm2"))
    # without proximal_t: its resumed tokens keep the float32 behave_logp, an error of another rule
    planted = planted.drop_columns(["proximal_t_logp", "proximal_t_version"])
    found(planted, logs, files=3)  # part0..part2.parquet, split by step
    files = sorted(logs.glob("part*.parquet"))
    clean = tmp_path / "clean"
    replay(files, clean, progress=False, workers=1)
    db = tmp_path / "m"
    crashed = cli_replay(files[:1], db, crash=f"after-commit:{files[0].name}")
    assert crashed.wait(timeout=300) == 70, crashed.stderr.read()
    resumed = replay(files[1:], db, progress=False, workers=1)
    assert_same_store(db, clean)
    with connect_store(db) as con:
        names = {n for (n,) in con.execute("SELECT DISTINCT name FROM file_evidence").fetchall()}
        assert {"columns", "tokens"} <= names  # zoo's tables, stored with each file
        (rows,) = con.execute("SELECT n_rows FROM run_finding WHERE rule = 'logp_low_precision'").fetchone()
    own = [f.rows for f in resumed.findings if f.rule == "logp_low_precision"]  # the resumed call's files
    assert own == [] or own[0] < rows


def test_replay_commits_its_files_in_groups_of_group_files(tmp_path):
    """GROUP_FILES + 1 files (well within GROUP_WAIT_S of each other) go in two commits: the first
    GROUP_FILES files in one, the last in the next; the outcomes keep the files' order."""
    spec = SyntheticSpec(run_id="g", seed=3, tokens_per_step=64, mean_length=8)
    n = GROUP_FILES + 1
    logs = [write_log_atomic(synthetic_steps(spec, i, 1), tmp_path / f"g-{i:02d}.parquet") for i in range(n)]
    db = tmp_path / "m"
    report = replay(logs, db, progress=False, workers=1)
    assert [(o.path, o.status) for o in report.outcomes] == [(p, "ingested") for p in logs]
    meta = "__ducklake_metadata_store"
    with connect_store(db) as con:
        (table,) = con.execute(
            f"SELECT table_id FROM {meta}.ducklake_table WHERE table_name = 'ingested_file' "
            "AND end_snapshot IS NULL"
        ).fetchone()
        snapshots = con.execute("SELECT snapshot_id, changes FROM ducklake_snapshots('store')").fetchall()
        per_commit = [
            con.execute(
                f"SELECT count(*) FROM ducklake_table_insertions('store', 'main', 'ingested_file', {s}, {s})"
            ).fetchone()[0]
            for s, changes in snapshots
            if str(table) in changes.get("inlined_insert", []) + changes.get("tables_inserted_into", [])
        ]
    assert per_commit == [GROUP_FILES, 1]


def _staleness_sketch(db: Path, run: str) -> pd.DataFrame:
    with connect_store(db) as con:
        return con.execute(
            "SELECT file_id, staleness, method, metric, bucket, count FROM sketch_by_staleness "
            "WHERE run_id = ? ORDER BY ALL",
            [run],
        ).df()


def test_a_run_of_several_files_has_one_merged_sketch_a_run_of_one_keeps_its_file_s(
    setup, tmp_path, monkeypatch
):
    """Run `a` (three files) stores its staleness sketch once, as file 0, the sum of what each of its files
    stores replayed alone; run `b` (one file) keeps its file's rows, not merged (nothing to merge). With a
    writer that merges after every commit (the mid-replay merge), the store is the same."""
    folder, logs, clean = setup
    alone = []
    for log in logs[:3]:
        replay([log], tmp_path / log.stem, progress=False, workers=1)
        alone.append(_staleness_sketch(tmp_path / log.stem, "a"))
    assert all(len(part) and (part["file_id"] != 0).all() for part in alone)
    keys = ["staleness", "method", "metric", "bucket"]
    summed = pd.concat(alone).groupby(keys, as_index=False)["count"].sum().sort_values(keys)
    merged = _staleness_sketch(clean, "a")
    assert (merged["file_id"] == 0).all()
    pd.testing.assert_frame_equal(
        merged.drop(columns="file_id").reset_index(drop=True),
        summed.reset_index(drop=True),
        check_dtype=False,
    )
    b = _staleness_sketch(clean, "b")
    assert len(b) and b["file_id"].nunique() == 1 and (b["file_id"] != 0).all()
    monkeypatch.setattr(store_writer, "MERGE_MIN_ROWS", 0)
    db = tmp_path / "merging"
    for part in ([logs[0]], [logs[3], logs[1]], [logs[2]]):
        replay(part, db, progress=False, workers=1)
    assert_same_store(db, clean)
