"""Readers during a replay of many small files (issue: readers starved by the write lock): raw read-only
DuckDB connections, `summary`, `gate`, the dashboard's queries and pages all succeed, and see the store at
most one published file behind what replay has reported. `evaluator/bench/readers.py` measures the same
on 200 files, with replay's speed with and without readers."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import queries
from evaluator.bench.readers import write_small_logs
from evaluator.cli.serve import APP
from evaluator.gate.judge import run_gate
from evaluator.summary import summary_table
from schemas.thresholds import DEFAULT_THRESHOLDS

N_FILES = 40


def raw_count(db: Path) -> int:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT count(*) FROM ingested_file").fetchone()[0]


READERS = {
    "raw duckdb": raw_count,
    "summary": lambda db: summary_table(db).num_rows,
    "gate": lambda db: len(run_gate(db, DEFAULT_THRESHOLDS).verdicts),
    "dashboard query": lambda db: int(queries.store_overview(db)["n_files"].sum()),
}


@pytest.mark.slow
def test_every_reader_succeeds_and_is_at_most_one_file_behind(tmp_path, monkeypatch):
    write_small_logs(tmp_path / "logs", N_FILES)
    db = tmp_path / "m.duckdb"
    command = [sys.executable, "-m", "evaluator.cli", "replay", str(tmp_path / "logs"), "--db", str(db)]
    replay = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    reported = []  # times at which replay reported each ingested file

    def follow() -> None:
        for line in replay.stdout:
            if ": ingested (" in line:
                reported.append(time.monotonic())

    follower = threading.Thread(target=follow)
    follower.start()
    attempts = {name: 0 for name in READERS}
    failures: dict[str, list[str]] = {name: [] for name in READERS}
    behind = []
    pages_ok = 0
    while replay.poll() is None:
        if not db.exists():
            time.sleep(0.02)
            continue
        for name, read in READERS.items():
            before = len(reported)
            attempts[name] += 1
            try:
                value = read(db)
            except Exception as error:  # any failure counts
                failures[name].append(repr(error))
                continue
            if name == "raw duckdb":
                behind.append(before - value)
        if pages_ok < 3 and replay.poll() is None:  # a dashboard page, as a browser would load it
            monkeypatch.setenv("PROXAUDIT_DB", str(db))
            at = AppTest.from_file(str(APP), default_timeout=60).run()
            pages_ok += not at.exception and not at.error and "database busy" not in str(at.info)
    follower.join()
    assert replay.returncode == 0 and len(reported) == N_FILES
    for name in READERS:
        assert attempts[name] >= 5, (name, attempts)
        assert len(failures[name]) <= attempts[name] // 100, (name, failures[name][:3])
    assert behind and max(behind) <= 1, behind  # a reader sees every file but the one just reported
    assert pages_ok >= 1
    assert raw_count(db) == N_FILES
