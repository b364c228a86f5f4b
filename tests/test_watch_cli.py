"""`proxaudit watch` as a user runs it, beside a simulated run written by another process: it alerts
`do_not_ship` on the planted drift while files still arrive and exits 1 with `--exit-on fail`; killed mid-run
(kill -9) and restarted, it ingests nothing twice, and its store equals a clean replay's, table by table
(timestamps aside: the findings and checks too, judged on every stored file of the run); beside a `replay`
process writing the same store, each file goes in once."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pytest
from test_store_writers import assert_same_store

from evaluator.duck import interrupted
from evaluator.replay import replay
from evaluator.store import open_store
from evaluator.store.derived import stale_runs
from evaluator.trainer.simulated_run import SimulatedRun
from evaluator.watch import read_alerts

PROXAUDIT = [sys.executable, "-m", "evaluator.cli"]
RUN = SimulatedRun(run_id="sim", tokens_per_step=4096, drift_from_step=1, drift_rate=0.1)  # fails by file 4
HANG_GUARD_S = 480  # only against a hang: no assertion is about time


def writer(out: Path) -> subprocess.Popen:
    """The simulated trainer: a file every second, until stopped."""
    args = ["--interval", "1", "--run-id", RUN.run_id, "--tokens-per-step", str(RUN.tokens_per_step),
            "--drift-from-step", str(RUN.drift_from_step), "--drift-rate", str(RUN.drift_rate)]  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "evaluator.trainer.simulated_run", str(out), *args],
        stdout=subprocess.DEVNULL,
    )


@pytest.mark.slow
def test_exit_on_fail_stops_watch_while_the_run_still_writes(tmp_path):
    args = [*PROXAUDIT, "watch", str(tmp_path / "logs"), "--db", str(tmp_path / "m"),
            "--alerts", str(tmp_path / "alerts.jsonl"), "--exit-on", "fail", "--interval", "0.5"]  # fmt: skip
    with open(tmp_path / "stdout", "w") as out, open(tmp_path / "stderr", "w") as err:
        watch, trainer = subprocess.Popen(args, stdout=out, stderr=err), None
        try:
            deadline = time.monotonic() + HANG_GUARD_S
            while "waiting for" not in (tmp_path / "stderr").read_text():  # watch looks before the first file
                assert watch.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr").read_text()
                time.sleep(0.1)
            trainer = writer(tmp_path / "logs")
            while watch.poll() is None and trainer.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)
            still_writing = trainer.poll() is None
        finally:
            watch.kill()
            if trainer is not None:
                trainer.kill()
                trainer.wait()
    stdout, stderr = (tmp_path / "stdout").read_text(), (tmp_path / "stderr").read_text()
    assert watch.returncode == 1, stderr
    assert still_writing  # the writer never stops on its own: watch stopped first, during the run
    verdicts = [r for r in read_alerts(tmp_path / "alerts.jsonl") if r["kind"] == "verdict"]
    assert verdicts[-1]["run_id"] == "sim" and verdicts[-1]["state"] == "do_not_ship"
    assert all(v["state"] != "do_not_ship" for v in verdicts[:-1])
    # the line says the change (or the first state, when the first look already saw the drift: a loaded
    # machine can fall several files behind the writer before it)
    last = verdicts[-1]
    change = "do_not_ship" if last["previous"] is None else f"{last['previous']} -> do_not_ship"
    assert f"alert: proxaudit watch: run sim: verdict {change}" in stdout
    assert "waiting for token logs in" in stderr  # the progress line


@pytest.mark.slow
def test_a_watch_killed_mid_run_and_restarted_ingests_nothing_twice(tmp_path):
    logs, db = tmp_path / "logs", tmp_path / "m"
    for i in range(3):
        RUN.write_file(logs, i)
    args = [*PROXAUDIT, "watch", str(logs), "--db", str(db), "--interval", "0.2"]
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        for line in first.stdout:  # kill -9 once the first file is in, the others on their way
            if ": ingested (" in line:
                break
        first.send_signal(signal.SIGKILL)
    finally:
        first.kill()
        first.wait()
    for i in range(3, 5):  # the run goes on while watch is down
        RUN.write_file(logs, i)
    again = subprocess.run([*args, "--until-idle", "--idle-after", "2"], capture_output=True, text=True,
                           timeout=HANG_GUARD_S)  # fmt: skip
    assert again.returncode == 0, again.stderr
    ingested = [line.split(": ")[0] for line in again.stdout.splitlines() if ": ingested (" in line]
    before = [
        line.split(": ")[0]
        for line in again.stdout.splitlines()
        if line.endswith("already ingested, unchanged")
    ]
    assert len(before) >= 1 and sorted(ingested + before) == sorted(str(p) for p in logs.glob("*.parquet"))
    clean = tmp_path / "clean"
    replay([logs], clean, progress=False, workers=1)  # in this process: no workers to start
    assert_same_store(db, clean)  # whatever the kill left, the store a clean replay writes
    assert not list(tmp_path.glob(".m.new-*"))  # no store left half made


def settled(db: Path) -> bool:
    """Are the run-level rows of every run computed from all its stored files (no writer's refresh due)?"""
    with open_store(db) as con:
        return not stale_runs(con, None)


@pytest.mark.slow
def test_watch_and_a_replay_process_fill_one_store_each_file_once(tmp_path):
    """`proxaudit watch` and `proxaudit replay` of the same folder, two processes writing one store at once,
    then the run writes more: every file is ingested by exactly one of them (the other finds it there), and
    the store is the one a clean replay writes."""
    logs, db = tmp_path / "logs", tmp_path / "m"
    for i in range(4):
        RUN.write_file(logs, i)
    watch_args = [*PROXAUDIT, "watch", str(logs), "--db", str(db), "--interval", "0.2"]
    replay_args = [*PROXAUDIT, "replay", str(logs), "--db", str(db), "--no-progress"]
    watch = subprocess.Popen(watch_args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    replaying = subprocess.Popen(replay_args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    watched_lines: list[str] = []
    try:
        replayed, _ = replaying.communicate(timeout=HANG_GUARD_S)
        after = [RUN.write_file(logs, i) for i in range(4, 6)]  # the run goes on: watch alone takes these
        waiting = {f"{path}: " for path in after}
        for line in watch.stdout:  # until watch has said its word on both (however long the replay took)
            watched_lines.append(line)
            waiting -= {start for start in waiting if line.startswith(start)}
            if not waiting:
                break
        while watch.poll() is None and not settled(db):  # judged the whole run again: Ctrl-C loses nothing
            time.sleep(0.2)
        watch.send_signal(signal.SIGINT)  # as a user ends it
        rest, _ = watch.communicate(timeout=HANG_GUARD_S)
    finally:
        for child in (watch, replaying):
            child.kill()
            child.wait()
    assert watch.returncode == 130 and replaying.returncode == 0
    watched = "".join(watched_lines) + rest
    lines = [*replayed.splitlines(), *watched.splitlines()]
    for path in sorted(logs.glob("*.parquet")):
        ingested = [line for line in lines if line.startswith(f"{path}: ingested (")]
        assert len(ingested) == 1, (path, [line for line in lines if line.startswith(f"{path}: ")])
    by_watch = {line.split(": ")[0] for line in watched.splitlines() if ": ingested (" in line}
    assert {str(path) for path in after} <= by_watch  # watch alone took the files after the replay
    clean = tmp_path / "clean"
    replay([logs], clean, progress=False, workers=1)
    assert_same_store(db, clean)


@pytest.mark.parametrize(
    "extra, why",
    [
        (["--out", "x"], "--out only with --import FORMAT"),
        (["--import", "skyrl", "--out", "x"], "give --trust-pickle"),
        (["--import", "nemo-rl"], "--import nemo-rl needs --out DIR"),
        (["--webhook", "file:///etc/passwd"], "not an http:// or https:// URL"),
    ],
)
def test_bad_options_are_usage_errors(tmp_path, extra, why):
    args = [*PROXAUDIT, "watch", str(tmp_path), "--db", str(tmp_path / "m"), *extra]
    result = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2 and why in result.stderr


def test_a_ctrl_c_during_a_query_is_a_ctrl_c():
    """Ctrl-C while watch judges lands in a DuckDB query, which DuckDB reports as its own error: watch
    takes it for the Ctrl-C it is ("stopped", exit 130), and any other error for an error."""
    con = duckdb.connect()
    caught: list[BaseException] = []

    def long_query() -> None:
        try:
            con.execute("SELECT count(*) FROM range(10000000000) a, range(10) b WHERE a.range + b.range = -1")
        except BaseException as error:  # noqa: BLE001 - what DuckDB raises is the point
            caught.append(error)

    thread = threading.Thread(target=long_query)
    thread.start()
    while thread.is_alive():
        con.interrupt()
        thread.join(0.05)
    assert caught and interrupted(caught[0]), caught
    assert interrupted(KeyboardInterrupt()) and not interrupted(RuntimeError("Query failed"))
    assert interrupted(RuntimeError("Query interrupted"))  # SIGINT during a query (seen in watch's judge)
