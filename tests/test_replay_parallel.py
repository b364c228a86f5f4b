"""A folder replayed on worker processes (`evaluator.replay.workers`) against the same folder replayed in
one process: the same stored numbers bit for bit, the same outcomes in the same order, and no worker
process left behind after an error or a Ctrl-C."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pandas as pd
import psutil
import pytest

from evaluator.logio import token_table, write_log_atomic
from evaluator.replay import pipeline as replay_module
from evaluator.replay import workers as worker_pool
from evaluator.replay.pipeline import replay
from evaluator.store import connect_store
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps

TABLES = ("ingested_file", "file_tokens", "metric_moments", "sketch_by_step", "sketch_by_staleness")
BATCH_ROWS = 1 << 13
"""Record batches of 8,192 rows: every file is read in several, and the long file has enough for two
ranges (a file needs `MIN_BATCHES_PER_THREAD` batches a thread to be cut unasked: none here is)."""


def write_folder(folder: Path) -> list[Path]:
    """Five logs of two runs (the long one of three record batches of `BATCH_ROWS`), a byte copy of one and a
    broken log."""
    a = SyntheticSpec(run_id="run-a", seed=3, tokens_per_step=2048, mean_length=32)
    long = SyntheticSpec(run_id="run-a", seed=5, tokens_per_step=1 << 12, mean_length=64)
    b = SyntheticSpec(run_id="run-b", seed=4, tokens_per_step=1024, prox_every=2, n_minibatches=2)
    files = [
        write_log_atomic(synthetic_steps(a, 0, 6), folder / "a-000.parquet"),
        write_log_atomic(synthetic_steps(long, 6, 5), folder / "a-006.parquet"),  # 20,483 rows
        write_log_atomic(synthetic_steps(b, 0, 12), folder / "b-000.parquet"),
        write_log_atomic(synthetic_steps(b, 12, 4), folder / "b-012.parquet"),
        write_log_atomic(synthetic_steps(a, 15, 3), folder / "c" / "a-015.parquet"),
    ]
    files.append(Path(shutil.copyfile(files[2], folder / "c" / "copy-of-b-000.parquet")))
    broken = synthetic_steps(SyntheticSpec(run_id="bad", tokens_per_step=256), 0, 2).to_pydict()
    broken["theta_logp"][:2] = [0.5, 0.25]
    files.append(write_log_atomic(token_table(broken), folder / "b-bad.parquet"))
    return files


def stored(db: Path) -> dict[str, pd.DataFrame]:
    """Every table, sorted by all its columns (`ingested_at` left out: it is the clock)."""
    con = connect_store(db)
    try:
        return {
            t: con.sql(f"SELECT * EXCLUDE (ingested_at) FROM {t} ORDER BY ALL").df()
            if t == "ingested_file"
            else con.sql(f"SELECT * FROM {t} ORDER BY ALL").df()
            for t in TABLES
        }
    finally:
        con.close()


def lines(folder: Path, db: Path, **options) -> list[str]:
    outcomes = []
    replay([folder], db, on_file=outcomes.append, progress=False, batch_rows=BATCH_ROWS, **options)
    return [o.line() for o in outcomes]


def workers_now() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("logs")
    write_folder(folder)
    return folder


@pytest.fixture(scope="module")
def sequential(folder, tmp_path_factory) -> tuple[list[str], dict[str, pd.DataFrame]]:
    """The folder replayed in this process: its output lines and its store."""
    db = tmp_path_factory.mktemp("sequential") / "seq"
    return lines(folder, db, workers=1), stored(db)


def assert_same_store(got: dict[str, pd.DataFrame], expected: dict[str, pd.DataFrame]) -> None:
    for table in TABLES:
        assert len(got[table]) > 0, table
        pd.testing.assert_frame_equal(got[table], expected[table], check_exact=True, obj=table)


def test_parallel_store_is_bit_identical_to_sequential(folder, sequential, tmp_path):
    sequential, expected = sequential
    parallel = lines(folder, tmp_path / "par", workers=2)
    assert parallel == sequential  # same outcomes, same order
    statuses = [line.split(": ")[1].split(" (")[0] for line in parallel]
    assert statuses.count("ingested") == 5 and statuses.count("skipped") == 1
    assert sum(": a copy of " in line for line in parallel) == 1  # the byte copy
    assert_same_store(stored(tmp_path / "par"), expected)
    assert lines(folder, tmp_path / "par", workers=2) == [
        line
        if "skipped" in line or ": a copy of " in line
        else f"{line.split(': ')[0]}: already ingested, unchanged"
        for line in parallel
    ]


def test_range_sized_file_waits_for_the_files_before_it(folder, sequential, tmp_path, monkeypatch):
    """A file long enough for ranges is summarised once every earlier file is in, in order; the workers
    summarise the others in record batches of the replay's `batch_rows`."""
    long_rows = int(duckdb.sql(f"SELECT count(*) FROM '{folder / 'a-006.parquet'}'").fetchall()[0][0])
    monkeypatch.setattr(replay_module, "default_workers", lambda n_rows, **_: 2 if n_rows == long_rows else 1)
    shipped, original = [], worker_pool.WorkerPool.map

    def recording(self, tasks):
        tasks = list(tasks)
        shipped.extend(tasks)
        return original(self, tasks)

    monkeypatch.setattr(worker_pool.WorkerPool, "map", recording)
    assert lines(folder, tmp_path / "par", workers=2) == sequential[0]
    assert_same_store(stored(tmp_path / "par"), sequential[1])
    summarised = [task for task in shipped if task.kind == "summarise"]
    assert "a-006.parquet" not in {task.path.name for task in summarised}  # in ranges here
    assert len(summarised) == 4 and {task.batch_rows for task in summarised} == {BATCH_ROWS}


def test_a_failing_worker_fails_its_file_only_and_leaves_no_process(folder, tmp_path, monkeypatch):
    """Every worker dies at start (a broken install): each file is reported as failed, with the worker's
    stderr, and the replay ends without a traceback or a process left."""
    before = workers_now()
    monkeypatch.setattr(worker_pool, "WORKER_MODULE", "evaluator.no_such_worker")
    report = replay([folder], tmp_path / "m", progress=False, workers=2)
    assert {o.status for o in report.outcomes} == {"failed"} and not report.clean
    assert all("worker process exited" in o.line() and "no_such_worker" in o.line() for o in report.outcomes)
    assert workers_now() == before


def test_ctrl_c_stops_the_workers_and_keeps_the_files_ingested(folder, sequential, tmp_path):
    """Ctrl-C as the first file is reported (once its group is committed): the workers stop, and the store
    keeps the files committed, the first of those a whole replay ingests (in its order)."""
    before, seen = workers_now(), []

    def interrupt_after_first(outcome) -> None:
        seen.append(workers_now() - before)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        replay([folder], tmp_path / "m", on_file=interrupt_after_first, progress=False, workers=2)
    assert len(seen[0]) == 2  # both workers were running when it was interrupted
    assert workers_now() == before
    kept = list(stored(tmp_path / "m")["ingested_file"]["path"])
    every = list(sequential[1]["ingested_file"].sort_values("path")["path"])
    assert kept and sorted(kept) == every[: len(kept)]


def test_worker_processes_only_for_files_worth_their_start(folder, tmp_path, monkeypatch):
    """Several files go to worker processes (one per core) once they hold `MIN_ROWS_FOR_WORKERS` rows in
    all, by their footers (a broken file counts none); fewer rows, or one file, stay in this process."""
    files = sorted(folder.rglob("*.parquet"))
    rows = sum(
        int(duckdb.sql(f"SELECT count(*) FROM '{f}'").fetchone()[0]) for f in files if "bad" not in f.name
    )
    rows += int(duckdb.sql(f"SELECT count(*) FROM '{folder / 'b-bad.parquet'}'").fetchone()[0])
    (folder.parent / "broken.parquet").write_bytes(b"PAR1 not a footer PAR1")
    with_broken = [*files, folder.parent / "broken.parquet"]
    monkeypatch.setattr(replay_module, "usable_cores", lambda: 7)
    monkeypatch.setattr(replay_module, "MIN_ROWS_FOR_WORKERS", rows)
    by_footers = sum(replay_module.footer_rows(path) for path in with_broken)
    assert replay_module.file_workers(len(with_broken), by_footers) == 7
    assert replay_module.file_workers(1, replay_module.footer_rows(files[0])) == 1
    monkeypatch.setattr(replay_module, "MIN_ROWS_FOR_WORKERS", rows + 1)
    assert replay_module.file_workers(len(with_broken), by_footers) == 1
