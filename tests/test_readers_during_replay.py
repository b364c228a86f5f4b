"""Readers during a replay of many small files: what a reader sees against what the writer has committed.

`proxaudit replay` runs in a child process whose store writer reports each commit (the files in the
store) and then waits for this test, so every reader (raw read-only DuckDB, `summary`, `gate`, the
dashboard's query and page) reads at a known point of the replay, in order, with no timing. Meanwhile
another thread reads the store nonstop, on the real clock. Checked: every read succeeds and sees exactly
the files committed so far (a reader never lags a commit), run-level and per-staleness quantiles within
the sketch's promise; each nonstop read saw whole commits (in its snapshot every table holds the same
files) and never went back. `evaluator/bench/readers.py` measures replay's speed with and without readers.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import queries
from evaluator.bench.readers import write_small_logs
from evaluator.cli.serve import APP
from evaluator.gate.judge import run_gate
from evaluator.replay.groups import GROUP_FILES
from evaluator.store import connect_store, open_store
from evaluator.verdict.summary import summary_table
from schemas.thresholds import DEFAULT_THRESHOLDS
from tests.reference import QUANTILE_PERCENT, loss_tokens, promised_value, within_promise

N_FILES = GROUP_FILES + 2
"""Two group commits, or more where a slow machine cuts a group short (`GROUP_WAIT_S`)."""
NONSTOP_PAUSE_S = 0.05
"""Between two reads of the nonstop reader: still many reads a commit, without holding a core the
replay and the other tests need."""
PER_FILE = ("file_tokens", "metric_moments", "sketch_by_step", "file_evidence")
"""Tables every ingested file has rows in: one snapshot shows each file in all or none of them."""
SKETCH_COUNTS = """
    SELECT (SELECT sum(count) FROM sketch_by_staleness WHERE method = 'ground_truth' AND metric = 'drift'),
           (SELECT sum(n) FROM metric_moments WHERE method = 'ground_truth' AND metric = 'drift')"""
"""The staleness sketches are merged over files (file_id 0, by the writer and at the end of a replay): whole
commits show the ground truth's drift counted as often in them as in the moments."""

DRIVER = r"""
import json, sys
import evaluator.store.writer as writer
from evaluator.cli import main

Writer = writer.StoreWriter
real_commit = Writer.commit

def event(kind, **fields):  # tell the test, then wait for it to say go
    fields.update(kind=kind)
    print("EVENT " + json.dumps(fields), file=sys.stderr, flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("the test went away")

def commit(self, staged):  # a group commit of replay
    done = real_commit(self, staged)
    files = self.con.execute("SELECT count(*) FROM ingested_file").fetchall()[0][0]
    event("committed", files=files, new=all(r is True for r in done))
    return done

Writer.commit = commit
sys.argv = ["proxaudit", "replay", sys.argv[1], "--db", sys.argv[2], "--no-progress"]
main()
"""


def truth_values(tokens) -> dict[str, np.ndarray]:
    """Metrics of the ground truth over loss tokens with prox_logp, in numpy (DOMAIN.md section 3)."""
    tokens = tokens[tokens["prox_logp"].notna()]
    g, b, t = (tokens[c].to_numpy(np.float64) for c in ("prox_logp", "behave_logp", "theta_logp"))
    return {"approx_logp": g, "drift": np.abs(g - b), "behave_imp_weight": np.exp(g - b),
            "importance_weight": np.exp(t - g)}  # fmt: skip


class Readers:
    """Every reader at one point of the replay, each checked against the first `published` files."""

    def __init__(self, db: Path, logs: list[Path], monkeypatch) -> None:
        self.db, self.monkeypatch = db, monkeypatch
        self.tokens = {i: loss_tokens([log]) for i, log in enumerate(logs)}
        self.pages = 0

    def check(self, published: int) -> None:
        with connect_store(self.db) as con:
            assert con.execute("SELECT count(*) FROM ingested_file").fetchone()[0] == published
        tokens = [self.tokens[i] for i in range(published)]
        n_tokens = sum(len(t) for t in tokens)
        overview = queries.store_overview(self.db)
        assert (overview["n_files"].sum(), overview["n_tokens"].sum()) == (published, n_tokens)
        assert run_gate(self.db, DEFAULT_THRESHOLDS).verdicts
        self.check_quantiles(tokens)
        if self.pages < 2 and published > 4:  # a dashboard page, as a browser would load it
            self.monkeypatch.setenv("PROXAUDIT_DB", str(self.db))
            at = AppTest.from_file(str(APP), default_timeout=60).run()
            assert not at.exception and not at.error, [e.value for e in at.exception]
            assert {m.label: m.value for m in at.metric}["tokens (loss_mask)"] == f"{n_tokens:,}"
            self.pages += 1

    def check_quantiles(self, tokens) -> None:
        """run_summary and staleness_summary (the staleness sketches, merged and not) of the ground truth
        against numpy over the published files' tokens."""
        tokens = pd.concat(tokens)
        rows = summary_table(self.db, method="ground_truth").to_pylist()
        by_metric = {r["metric"]: r for r in rows}
        for metric, values in truth_values(tokens).items():
            assert by_metric[metric]["n"] == len(values), metric
            for stat in QUANTILE_PERCENT:
                assert within_promise(by_metric[metric][stat], promised_value(values, stat)), (metric, stat)
        rows = summary_table(self.db, by="staleness", method="ground_truth", metric="drift").to_pylist()
        for row in rows:
            values = truth_values(tokens[tokens["staleness"] == row["staleness"]])["drift"]
            assert row["n"] == len(values)
            for stat in QUANTILE_PERCENT:
                assert within_promise(row[stat], promised_value(values, stat)), (row["staleness"], stat)


def read_nonstop(db: Path, stop: threading.Event, read_done: threading.Event, seen: list) -> None:
    """Reads as fast as they go, on the real clock: the files each per-file table holds in the reader's
    snapshot (or the error)."""
    tables = " UNION ALL ".join(f"SELECT '{t}', count(DISTINCT file_id) FROM {t}" for t in PER_FILE)
    while not stop.is_set():
        if not (db / "catalog.sqlite").exists():
            time.sleep(0.01)
            continue
        try:
            with open_store(db) as con:
                files = con.execute("SELECT count(*) FROM ingested_file").fetchone()[0]
                per_table = dict(con.execute(tables).fetchall())
                sketched, counted = con.execute(SKETCH_COUNTS).fetchone()
                value = (files, per_table | {"sketch_by_staleness": files if sketched == counted else None})
        except Exception as error:  # any failure counts
            value = repr(error)
        seen.append(value)
        read_done.set()
        time.sleep(NONSTOP_PAUSE_S)


@pytest.mark.slow
def test_readers_see_every_commit_whole(tmp_path, monkeypatch):
    write_small_logs(tmp_path / "logs", N_FILES)
    logs, db = sorted((tmp_path / "logs").glob("*.parquet")), tmp_path / "m"
    command = [sys.executable, "-c", DRIVER, str(tmp_path / "logs"), str(db)]
    replay = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)  # fmt: skip
    out: list[str] = []
    printer = threading.Thread(target=lambda: out.extend(replay.stdout))
    printer.start()
    stop, read_done, nonstop = threading.Event(), threading.Event(), []
    reader = threading.Thread(target=read_nonstop, args=(db, stop, read_done, nonstop))
    readers, errors, middle = Readers(db, logs, monkeypatch), [], False
    try:
        reader.start()
        for line in replay.stderr:
            if not line.startswith("EVENT "):
                errors.append(line)
                continue
            e = json.loads(line[6:])
            assert e["new"]
            readers.check(e["files"])  # no lag: every commit, at once
            if not middle and e["files"] < N_FILES:  # a read of the other thread in the middle of the replay
                middle = True
                read_done.clear()
                assert read_done.wait(120), "the nonstop reader did not read"
            replay.stdin.write("go\n")
            replay.stdin.flush()
    finally:
        stop.set()
        replay.stdin.close()
        replay.wait(timeout=120)
        printer.join()
        reader.join()
    assert replay.returncode == 0, "".join(errors)
    assert sum(": ingested (" in line for line in out) == N_FILES
    assert nonstop and all(isinstance(value, tuple) for value in nonstop), [
        value for value in nonstop if not isinstance(value, tuple)
    ][:3]
    seen = [files for files, _ in nonstop]
    assert all(set(per_table.values()) == {files} for files, per_table in nonstop)  # whole commits
    assert seen == sorted(seen) and 0 < seen[-1] <= N_FILES  # never back to an older snapshot
