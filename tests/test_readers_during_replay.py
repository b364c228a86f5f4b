"""Readers during a replay of many small files: what a reader sees against what the writer has ingested.

`proxaudit replay` runs in a child process whose store writer reports each ingest and publish (the
files in its working copy, the files in the published store) and then waits for this test, so every
reader (raw read-only DuckDB, `summary`, `gate`, the dashboard's query and page) reads at a known point
of the replay, in order, with no timing. The writer's clock is a virtual one: each file takes FILE_S and
each copy of the store `copy_seconds(files in it)`, so which files are followed by a publish is decided
by docs/replay.md's rule alone, on any machine. Meanwhile another thread reads the store nonstop, on the
real clock. Checked: every read succeeds and sees exactly the latest publish (the raw count, the
dashboard's files and tokens, run-level and per-staleness quantiles within the sketch's promise, so
across the staleness-sketch merges of the middle of the replay); the publishes follow the rule (the
throttle); the publish lag in files and seconds stays within the documented bound.
`evaluator/bench/readers.py` measures the same on 200 files, with replay's speed with and without readers.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import queries
from evaluator.bench.readers import write_small_logs
from evaluator.cli.serve import APP
from evaluator.gate.judge import run_gate
from evaluator.verdict.summary import summary_table
from schemas.thresholds import DEFAULT_THRESHOLDS
from tests.reference import QUANTILE_PERCENT, loss_tokens, promised_value, within_promise

N_FILES = 20
FILE_S = 1.0
COPY_S = (0.0125, 0.025)  # a copy of a store of k files takes 0.0125 + 0.025 k seconds (virtual)
CHEAP_S, SHARE = 0.05, 0.1  # docs/replay.md: every file while a copy takes under 50 ms, else 10x its time


def copy_seconds(files: int) -> float:
    """The virtual time a copy of a store of `files` files takes: it grows with the store (ten times it
    is never within 0.125 s of a whole number of FILE_S, so no decision sits on a boundary)."""
    return COPY_S[0] + COPY_S[1] * files


DRIVER = r"""
import json, sys, time
from types import SimpleNamespace
import duckdb
import evaluator.store.writer as writer
from evaluator.cli import main

real_clock, virtual, copying = time.monotonic, [0.0], [0]
writer.time = SimpleNamespace(monotonic=lambda: virtual[0], sleep=time.sleep)  # the writer's clock
FILE_S, COPY_BASE, COPY_PER_FILE = (float(x) for x in sys.argv[3:6])
real_copy, Writer = writer.publish_copy, writer.StoreWriter
real_ingest, real_publish = Writer.ingest, Writer.publish

def files_in(con):
    return con.execute("SELECT count(*) FROM ingested_file").fetchall()[0][0]  # no result left open

def event(kind, **fields):  # tell the test, then wait for it to say go
    fields.update(kind=kind, real=real_clock(), virtual=virtual[0])
    print("EVENT " + json.dumps(fields), file=sys.stderr, flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("the test went away")

def copy(work, db):  # the copy of publish takes virtual time, growing with the store
    virtual[0] += COPY_BASE + COPY_PER_FILE * copying[0]
    real_copy(work, db)

def ingest(self, *args, **kwargs):
    virtual[0] += FILE_S  # the file's check and summary
    committed = virtual[0]  # the clock stands still in the transaction, moves during a publish
    done = real_ingest(self, *args, **kwargs)
    event("ingested", files=files_in(self.con), new=done is True, committed=committed)
    return done

def publish(self, final=False):
    sketch_rows = "SELECT count(*) FROM sketch_by_staleness"
    before, copying[0] = self.con.execute(sketch_rows).fetchall()[0][0], files_in(self.con)
    start = real_clock()
    real_publish(self, final)
    end = real_clock()
    with duckdb.connect(str(self.db), read_only=True) as con:
        published = files_in(con)
    event("published", files=files_in(self.con), published=published, start=start, end=end, final=final,
          sketch_rows=[before, self.con.execute(sketch_rows).fetchall()[0][0]])

writer.publish_copy, Writer.ingest, Writer.publish = copy, ingest, publish
sys.argv = ["proxaudit", "replay", sys.argv[1], "--db", sys.argv[2], "--no-progress"]
main()
"""


def expected_publishes(n_files: int) -> list[int]:
    """After which files the writer publishes, by docs/replay.md's rule on the virtual clock (the first
    file always: no copy has been timed yet); the last one at the end whatever the rule."""
    clock = published_at = copy_s = 0.0
    after = []
    for k in range(1, n_files + 1):
        clock += FILE_S
        if copy_s < CHEAP_S or clock - published_at >= copy_s / SHARE:
            copy_s = copy_seconds(k)
            clock += copy_s
            published_at = clock
            after.append(k)
    return after if after[-1] == n_files else [*after, n_files]


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

    def check(self, published: int, with_quantiles: bool) -> None:
        with duckdb.connect(str(self.db), read_only=True) as con:
            assert con.execute("SELECT count(*) FROM ingested_file").fetchone()[0] == published
        tokens = [self.tokens[i] for i in range(published)]
        n_tokens = sum(len(t) for t in tokens)
        overview = queries.store_overview(self.db)
        assert (overview["n_files"].sum(), overview["n_tokens"].sum()) == (published, n_tokens)
        if with_quantiles:  # after each publish (the gate and summary take longer)
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
    """Raw read-only reads as fast as they go, on the real clock: (start, end, files seen or the error)."""
    while not stop.is_set():
        if not db.exists():
            time.sleep(0.01)
            continue
        start = time.monotonic()
        try:
            with duckdb.connect(str(db), read_only=True) as con:
                value = con.execute("SELECT count(*) FROM ingested_file").fetchone()[0]
        except Exception as error:  # any failure counts
            value = repr(error)
        seen.append((start, time.monotonic(), value))
        read_done.set()


@pytest.mark.slow
def test_readers_see_the_latest_publish_and_the_lag_stays_within_the_bound(tmp_path, monkeypatch):
    write_small_logs(tmp_path / "logs", N_FILES)
    logs, db = sorted((tmp_path / "logs").glob("*.parquet")), tmp_path / "m.duckdb"
    schedule = expected_publishes(N_FILES)
    command = [sys.executable, "-c", DRIVER, str(tmp_path / "logs"), str(db), *map(str, (FILE_S, *COPY_S))]
    replay = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)  # fmt: skip
    out: list[str] = []
    printer = threading.Thread(target=lambda: out.extend(replay.stdout))
    printer.start()
    stop, read_done, nonstop = threading.Event(), threading.Event(), []
    reader = threading.Thread(target=read_nonstop, args=(db, stop, read_done, nonstop))
    readers, events, errors = Readers(db, logs, monkeypatch), [], []
    published = ingested = 0
    try:
        reader.start()
        for line in replay.stderr:
            if not line.startswith("EVENT "):
                errors.append(line)
                continue
            e = json.loads(line[6:])
            events.append(e)
            ingested = e["files"]
            if e["kind"] == "published":
                assert e["published"] == e["files"]  # a publish holds every file ingested before it
                published = e["published"]
            readers.check(published, with_quantiles=e["kind"] == "published")
            if ingested == N_FILES // 2:  # a read of the other thread in the middle of the replay, too
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
    publishes = [e for e in events if e["kind"] == "published"]
    # the throttle: a publish after exactly the files the documented rule names, the last one at the end
    assert [e["files"] for e in publishes] == schedule
    assert publishes[-1]["final"] and len(schedule) < N_FILES  # some files waited for a later publish
    # the staleness sketches were merged in the middle of the replay, with quantiles checked after it
    assert any(after < before for before, after in (e["sketch_rows"] for e in publishes[:-1]))
    assert_lag_within_bound(events)
    assert_nonstop_reads_saw_whole_publishes(nonstop, publishes)


def assert_lag_within_bound(events: list[dict]) -> None:
    """docs/replay.md: a reader is behind the writer by the files ingested since the last publish: at most
    those ingested within ten copy-times of it, plus the one being published; in time, at most ten times
    the last copy, plus the time between two files, plus the copy. Measured at every point of the replay
    on the writer's clock."""
    committed, last, lags = {}, None, []  # file -> when its transaction ended; the last publish
    for e in events:
        if e["kind"] == "ingested" and e["new"]:
            committed[e["files"]] = e["committed"]
        if e["kind"] == "published":
            last = e
        done, since = (last["published"], last["virtual"]) if last else (0, 0.0)
        limit = copy_seconds(done) / SHARE if last else 0.0
        behind = [k for k in committed if k > done]  # ingested, not yet published
        lag_files, lag_s = len(behind), e["virtual"] - committed[min(behind)] if behind else 0.0
        in_window = [k for k in behind if committed[k] - since < limit]
        assert lag_files <= len(in_window) + 1, (e, behind, in_window)
        assert lag_s <= limit + FILE_S + copy_seconds(e["files"]), (e, lag_s)
        lags.append((lag_files, lag_s))
    files, seconds = max(f for f, _ in lags), max(s for _, s in lags)
    print(f"publish lag: up to {files} files, {seconds:.2f} s on the writer's clock")


def assert_nonstop_reads_saw_whole_publishes(nonstop: list, publishes: list[dict]) -> None:
    """Each read of the nonstop reader succeeded and saw the files of one publish: no older than the last
    publish that had ended before the read began, no newer than the last that had begun before it ended."""
    assert nonstop and all(isinstance(files, int) for _, _, files in nonstop), nonstop[:3]
    counts = {e["published"] for e in publishes}
    for start, end, files in nonstop:
        done = [e["published"] for e in publishes if e["end"] < start]
        begun = [e["published"] for e in publishes if e["start"] < end]
        assert files in counts and (done[-1] if done else 0) <= files <= (begun[-1] if begun else 0)
