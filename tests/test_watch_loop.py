"""The watch loop (evaluator.watch.loop) in this process, poll by poll on a clock of its own: files arrive and
go in once, each change of state is one alert, idle folders end the run, `exit_on` stops at the first
do_not_ship, a restart ingests and repeats nothing, another writer of the store holds nothing up and shares
no file, a trainer's dumps are imported once complete, and each look runs in a process of its own, replaced
after its looks, that dies with watch."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from test_store_writers import assert_same_store

from evaluator.importers import nemo_rl
from evaluator.replay import replay
from evaluator.store import StoreWriter, connect_store, reader
from evaluator.store.checks import snapshot_id
from evaluator.store.derived import mergeable
from evaluator.store.lake import locate, store_key
from evaluator.store.maintenance import merge_run_sketches
from evaluator.trainer.simulated_run import SimulatedRun
from evaluator.watch import loop, read_alerts
from evaluator.watch.dumps import DumpImporter
from evaluator.watch.listing import Lister
from evaluator.watch.look import LOOK_WORKER, LookProcess
from evaluator.watch.loop import Watcher, WatchOptions
from evaluator.watch.progress import Status
from tests.conftest import FIXTURES

RUN = SimulatedRun(run_id="sim", tokens_per_step=4096, drift_from_step=1, drift_rate=0.1)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Lines(Status):
    """The status without a terminal, keeping every printed line."""

    def __init__(self) -> None:
        super().__init__(enabled=False)
        self.lines: list[str] = []
        self.shown: list[str] = []

    def echo(self, line: str, err: bool = False) -> None:
        self.lines.append(line)

    def show(self, text: str, key: tuple) -> None:
        self.shown.append(text)


OPEN: list[Watcher] = []


@pytest.fixture(autouse=True)
def _close_watchers():
    """Each test's watchers closed after it (their looks' processes stopped)."""
    yield
    while OPEN:
        OPEN.pop().close()


def watcher(tmp_path: Path, clock: Clock, **keys) -> tuple[Watcher, Lines]:
    options = WatchOptions(
        paths=(tmp_path / "logs",), db=tmp_path / "metrics", alerts=tmp_path / "alerts.jsonl",
        idle_after=60.0, **keys,
    )  # fmt: skip
    lines = Lines()
    OPEN.append(Watcher(options, lines, clock))
    return OPEN[-1], lines


def look_processes(parent: int | None = None) -> list[psutil.Process]:
    """The children of `parent` (None: this process) that run watch's looks."""
    return [p for p in psutil.Process(parent).children() if LOOK_WORKER in " ".join(p.cmdline())]


def kinds(path: Path) -> list[tuple]:
    return [(r["kind"], r["state"]) for r in read_alerts(path)]


def test_files_go_in_as_they_arrive_and_idle_folders_end_the_run(tmp_path):
    clock = Clock()
    watch, lines = watcher(tmp_path, clock, until_idle=True)
    assert watch.poll() is None and lines.shown[-1].startswith(f"waiting for {tmp_path / 'logs'} to appear")
    RUN.write_file(tmp_path / "logs", 0)
    temporary = tmp_path / "logs" / ".sim-step000001-000001-0001.parquet.x1y2.tmp"
    temporary.write_bytes(b"PAR1 half")  # the hook's next file, being written
    assert watch.poll() is None
    ingested = [line for line in lines.lines if ": ingested (" in line]
    assert len(ingested) == 1 and ingested[0].startswith(str(tmp_path / "logs" / RUN.file_name(0)))
    assert "1 complete (1 ingested by this watch), 1 being written" in lines.shown[-1]
    # step 0 holds staleness 0 alone: judged at S = 0, where every estimate is behave_logp (the gate's rule)
    assert kinds(tmp_path / "alerts.jsonl") == [("verdict", "ship")]
    temporary.unlink()
    RUN.write_file(tmp_path / "logs", 1)
    clock.now += 5
    assert watch.poll() is None and watch.ingested == 2
    clock.now += 59  # 59 s since the last change: not idle yet
    assert watch.poll() is None
    clock.now += 1
    assert watch.poll() == 0  # idle, nothing left to ingest: the run ended
    assert kinds(tmp_path / "alerts.jsonl")[-1] == ("idle", "idle")
    first = read_alerts(tmp_path / "alerts.jsonl")[0]
    assert first["as_of"] == str(tmp_path / "logs" / RUN.file_name(0))  # judged after the file went in


def test_a_watch_behind_judges_after_each_group_of_files(tmp_path, monkeypatch):
    """Files due beyond `FILES_PER_LOOK` wait for the next look: the run is judged (and alerted) on the
    oldest ones first, a group at a time, and the run ends only once every file is in."""
    monkeypatch.setattr(loop, "FILES_PER_LOOK", 2)
    small = SimulatedRun(run_id="sim", tokens_per_step=512)
    paths = [small.write_file(tmp_path / "logs", i) for i in range(3)]
    clock = Clock()
    watch, _ = watcher(tmp_path, clock, until_idle=True)
    assert watch.poll() is None and watch.ingested == 2 and watch.as_of == str(paths[1])
    assert read_alerts(tmp_path / "alerts.jsonl")[0]["as_of"] == str(paths[1])  # judged on the first two
    clock.now += 60  # idle since the first look, but a file is still due
    assert watch.poll() is None and watch.ingested == 3 and watch.as_of == str(paths[2])
    assert watch.poll() == 0


def test_each_look_runs_in_a_process_of_its_own_replaced_after_its_looks(tmp_path, monkeypatch):
    """Replay and judging happen in the looks' process, a fresh one after `looks_per_process` looks: watch's
    own process opens no reader of the store (it keeps nothing a look allocated), the files, verdicts
    and alerts are what one process would give, and the snapshot up to which the looks checked the store's
    values is handed on (a fresh process does not read the whole store again), and every `MERGE_EVERY`
    tidyings the small files of the tables looks read are merged."""
    monkeypatch.setattr(loop, "MERGE_EVERY", 2)
    clock, pids = Clock(), []
    watch, lines = watcher(tmp_path, clock)
    watch.looks = LookProcess(looks_per_process=2)
    for i in range(3):
        RUN.write_file(tmp_path / "logs", i)
        clock.now += 10
        assert watch.poll() is None
        pids.append([p.pid for p in look_processes()])
    assert len(pids[0]) == 1 and pids[1] == pids[0] and len(pids[2]) == 1 and pids[2] != pids[0]
    assert not psutil.pid_exists(pids[0][0]) or psutil.Process(pids[0][0]).status() == psutil.STATUS_ZOMBIE
    assert watch.ingested == 3 and sum(": ingested (" in line for line in lines.lines) == 3
    assert store_key(locate(tmp_path / "metrics")) not in reader._POOL  # no reader opened here
    assert [v.run_id for v in watch.verdicts] == ["sim"] and kinds(tmp_path / "alerts.jsonl")
    meta = "__ducklake_metadata_store"
    live = (
        f"SELECT count(*) FROM {meta}.ducklake_data_file d JOIN {meta}.ducklake_table t USING (table_id) "
        "WHERE table_name = 'metric_moments' AND d.end_snapshot IS NULL AND t.end_snapshot IS NULL"
    )
    with connect_store(tmp_path / "metrics") as con:
        assert watch.checked is not None and watch.checked[1] == snapshot_id(con)
        assert con.execute(live).fetchone() == (2,)  # the first two merged by the second look, the third's


def test_a_look_s_alerts_are_raised_before_its_sketches_are_merged(tmp_path):
    """A look judges the run on the new files' staleness sketch rows as they were staged, and watch writes
    its alerts before the tidying merges them (the merge does not delay an alert); after it the run's rows
    are one merged sketch, as a clean replay leaves them."""
    clock = Clock()
    watch, _ = watcher(tmp_path, clock)
    for i in range(3):
        RUN.write_file(tmp_path / "logs", i)
    seen, tidy = [], watch._tidy

    def looking_first(final: bool) -> None:
        with connect_store(tmp_path / "metrics") as con:
            seen.append((read_alerts(tmp_path / "alerts.jsonl"), mergeable(con)))
        tidy(final)

    watch._tidy = looking_first
    clock.now += 10
    assert watch.poll() is None and watch.ingested == 3
    ((alerts, unmerged),) = seen
    assert alerts and unmerged == ["sim"]
    with connect_store(tmp_path / "metrics") as con:
        assert mergeable(con) == []
    replay([tmp_path / "logs"], tmp_path / "clean", progress=False)
    assert_same_store(tmp_path / "metrics", tmp_path / "clean")


def test_the_tidying_waits_while_files_wait_for_at_most_its_looks(tmp_path, monkeypatch):
    """One file a look, four files waiting: the first look tidies (`TIDY_AFTER` 2 looks, counting the
    tidying a watch owes at start), the second leaves its run's rows unmerged (files still wait), the third
    tidies (two looks) and merges three files' rows, the fourth, caught up, tidies but leaves the one new
    file's rows, fewer than the merged ones, unmerged; the run ended, the last tidying merges them."""
    monkeypatch.setattr(loop, "FILES_PER_LOOK", 1)
    monkeypatch.setattr(loop, "TIDY_AFTER", 2)
    clock = Clock()
    watch, _ = watcher(tmp_path, clock, until_idle=True)
    for i in range(4):
        RUN.write_file(tmp_path / "logs", i)
    after = []
    for _ in range(4):
        clock.now += 10
        assert watch.poll() is None
        with connect_store(tmp_path / "metrics") as con:
            after.append((watch.ingested, watch.tidied, mergeable(con)))
    assert after == [(1, 1, []), (2, 1, ["sim"]), (3, 2, []), (4, 3, ["sim"])]
    clock.now += 61
    assert watch.poll() == 0 and watch.tidied == 4
    with connect_store(tmp_path / "metrics") as con:
        assert mergeable(con) == []
    replay([tmp_path / "logs"], tmp_path / "clean", progress=False)
    assert_same_store(tmp_path / "metrics", tmp_path / "clean")


def test_while_the_run_goes_on_a_run_s_sketch_is_merged_once_its_new_rows_match_the_merged(tmp_path):
    """`merge_run_sketches(grown=True)` (watch's tidying between looks) merges a run's staleness sketch
    only when the rows of files not merged yet are at least as many as the merged rows (counted here
    straight from the table); a run of one file is never merged."""
    for i in range(6):
        RUN.write_file(tmp_path / "logs", i)
    files = sorted((tmp_path / "logs").glob("*.parquet"))
    db = tmp_path / "metrics"
    outcomes = []
    for i, path in enumerate(files):
        replay([path], db, progress=False, merge=False)
        with connect_store(db) as con:
            merged, new, n_files = con.execute(
                "SELECT count(*) FILTER (file_id = 0), count(*) FILTER (file_id != 0), "
                "count(DISTINCT file_id) FROM sketch_by_staleness"
            ).fetchone()
        due = n_files > 1 and new >= merged
        assert merge_run_sketches(db, grown=True) == (["sim"] if due else []), i
        outcomes.append(due)
    assert outcomes[0] is False and True in outcomes[1:] and False in outcomes[2:]


def test_a_restarted_watch_merges_what_a_killed_one_left_unmerged(tmp_path):
    """A watch killed between a look and its tidying leaves a run's rows unmerged; the next watch merges
    them at its first look, though it ingests nothing."""
    for i in range(2):
        RUN.write_file(tmp_path / "logs", i)
    replay([tmp_path / "logs"], tmp_path / "metrics", progress=False, merge=False)
    with connect_store(tmp_path / "metrics") as con:
        assert mergeable(con) == ["sim"]
    watch, _ = watcher(tmp_path, Clock())
    assert watch.poll() is None and watch.ingested == 0
    with connect_store(tmp_path / "metrics") as con:
        assert mergeable(con) == []


def test_a_look_s_process_dies_with_watch(tmp_path):
    """Killed with -9, watch leaves no look writing the store behind it (Linux: the kernel ends it). The
    look's process is stopped (SIGSTOP) first, as if busy: it never reads the closed pipe, so only the
    kernel's signal on watch's death ends it."""
    code = (
        "import sys, time; from pathlib import Path; from evaluator.watch.loop import Watcher, WatchOptions; "
        "from evaluator.watch.progress import Status; "
        "w = Watcher(WatchOptions(paths=(Path(sys.argv[1]),), db=sys.argv[2]), Status(enabled=False)); "
        "w.poll(); print('looked', flush=True); time.sleep(600)"
    )
    RUN.write_file(tmp_path / "logs", 0)
    watch = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path / "logs"), str(tmp_path / "metrics")],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        while (line := watch.stdout.readline()) != "looked\n":  # the look's lines first
            assert line, "the watch ended before its first look"
        (look,) = look_processes(watch.pid)
        look.suspend()
        watch.send_signal(signal.SIGKILL)
        watch.wait()
        _, alive = psutil.wait_procs([look], timeout=60)  # a bound against a hang, not a timing
        for process in alive:  # left stopped: not left behind by this test
            process.kill()
        assert not alive
    finally:
        watch.kill()
        watch.wait()


def test_exit_on_fail_stops_at_the_first_do_not_ship(tmp_path):
    clock = Clock()
    watch, _ = watcher(tmp_path, clock, exit_on=frozenset({"fail"}))
    codes = []
    for i in range(8):  # the approximation fails by file 4 (step 3: RUN drifts from step 1)
        RUN.write_file(tmp_path / "logs", i)
        clock.now += 10
        codes.append(watch.poll())
        if codes[-1] is not None:
            break
    assert codes[-1] == 1 and codes[:-1] == [None] * (len(codes) - 1)
    states = [state for kind, state in kinds(tmp_path / "alerts.jsonl") if kind == "verdict"]
    assert states[-1] == "do_not_ship" and "do_not_ship" not in states[:-1]
    assert len(set(states)) > 1  # it changed state on the way


def test_a_restart_ingests_nothing_twice_and_repeats_no_alert(tmp_path):
    clock = Clock()
    for i in range(3):
        RUN.write_file(tmp_path / "logs", i)
    first, _ = watcher(tmp_path, clock)
    first.poll()
    alerts = read_alerts(tmp_path / "alerts.jsonl")
    again, lines = watcher(tmp_path, clock)
    assert again.poll() is None
    assert [line.split(": ")[-1] for line in lines.lines] == ["already ingested, unchanged"] * 3
    assert read_alerts(tmp_path / "alerts.jsonl") == alerts


def test_another_writer_of_the_store_holds_nothing_up(tmp_path):
    """A store takes several writers at once: with another replay's writer open on it, the file goes in at
    the first look."""
    clock = Clock()
    RUN.write_file(tmp_path / "logs", 0)
    watch, lines = watcher(tmp_path, clock)
    with StoreWriter(tmp_path / "metrics"):  # another replay has the store open
        assert watch.poll() is None
        assert watch.ingested == 1 and any(": ingested (" in line for line in lines.lines)


def test_a_replay_writing_the_same_store_at_once_ingests_no_file_twice(tmp_path):
    """`proxaudit replay` of the same folder into the same store while watch looks: each file is ingested by
    one of them (the other finds it there), and the store is the one a clean replay writes."""
    logs = tmp_path / "logs"
    for i in range(4):
        RUN.write_file(logs, i)
    command = [sys.executable, "-m", "evaluator.cli", "replay", str(logs), "--db", str(tmp_path / "metrics")]
    other = subprocess.Popen([*command, "--no-progress"], stdout=subprocess.PIPE, text=True)
    replayed = [other.stdout.readline()]
    while ": ingested (" not in replayed[-1]:  # watch looks once the replay has committed a file
        assert replayed[-1], "the replay ended without ingesting a file"
        replayed.append(other.stdout.readline())
    watch, lines = watcher(tmp_path, Clock())
    assert watch.poll() is None
    replayed += other.stdout.readlines()
    assert other.wait(timeout=300) == 0
    for path in sorted(logs.glob("*.parquet")):
        said = [line for line in (*replayed, *lines.lines) if line.startswith(f"{path}: ")]
        outcomes = sorted(line.strip().split(": ", 1)[1].split(" (")[0] for line in said)
        assert outcomes == ["already ingested, unchanged", "ingested"], said
    assert watch.ingested == sum(": ingested (" in line for line in lines.lines)
    clean = tmp_path / "clean"
    replay([logs], clean, progress=False, workers=1)  # in this process: no workers to start
    assert_same_store(tmp_path / "metrics", clean)


@pytest.fixture
def nemo_dump(tmp_path) -> Path:
    """NeMo-RL's real dump (fixtures/importers/nemo-rl), its step 1 written, step 2 not yet."""
    folder = tmp_path / "logs"
    folder.mkdir()
    shutil.copy(FIXTURES / "importers" / "nemo-rl" / "train_data_step1.jsonl", folder)
    return folder


def test_a_dump_is_imported_once_complete(nemo_dump, tmp_path):
    clock = Clock()
    importer = DumpImporter("nemo-rl", tmp_path / "imported", "nemo")
    watch, lines = watcher(tmp_path, clock, importer=importer, until_idle=True)
    assert watch.poll() is None and watch.ingested == 0  # step 1 may still be written
    assert "waiting for NeMo-RL dumps" in lines.shown[-1] and "0 complete" in lines.shown[-1]
    shutil.copy(FIXTURES / "importers" / "nemo-rl" / "train_data_step2.jsonl", nemo_dump)
    assert watch.poll() is None and watch.ingested == 1  # step 2 appeared: step 1 is whole
    log = tmp_path / "imported" / "nemo-train_data_step1.parquet"
    assert lines.lines[0].startswith(f"{log}: ingested (")
    by_import = nemo_rl.convert(nemo_dump / "train_data_step1.jsonl", tmp_path / "by-import", "nemo").out
    first_bytes = log.read_bytes()
    assert first_bytes == by_import.read_bytes()  # what `proxaudit import nemo-rl` writes
    clock.now += 60
    assert watch.poll() is None and watch.ingested == 2  # the run ended: step 2 ends with a newline
    assert watch.poll() == 0
    # a restart imports nothing again: the logs are newer than their dumps (and the bytes are the same)
    again, lines = watcher(tmp_path, clock, importer=DumpImporter("nemo-rl", tmp_path / "imported", "nemo"))
    clock.now += 60
    again.poll()
    assert log.read_bytes() == first_bytes and lines.lines[0].endswith("already ingested, unchanged")


def test_an_import_makes_the_same_bytes_twice(nemo_dump, tmp_path):
    importer = DumpImporter("nemo-rl", tmp_path / "a", "nemo")
    (entry,) = Lister([nemo_dump]).scan()
    (a,), _ = importer.convert([entry])
    (b,), _ = DumpImporter("nemo-rl", tmp_path / "b", "nemo").convert([entry])
    assert a.read_bytes() == b.read_bytes()


def test_each_run_folder_of_dumps_is_its_own_run(tmp_path):
    """Dumps of two runs under the watched folder (each in the folder the trainer wrote it into): each is a
    run named after its folder, as `proxaudit import` names it; with --run-id, the second folder is refused
    with the reason and nothing of it is imported."""
    for run in ("run-a", "run-b"):
        (tmp_path / "logs" / run).mkdir(parents=True)
        for step in (1, 2):
            shutil.copy(
                FIXTURES / "importers" / "nemo-rl" / f"train_data_step{step}.jsonl", tmp_path / "logs" / run
            )
    clock = Clock()
    watch, _ = watcher(
        tmp_path, clock, importer=DumpImporter("nemo-rl", tmp_path / "imported"), until_idle=True
    )
    clock.now += 120  # the run ended: every step is whole
    while watch.poll() is None:
        clock.now += 120
    with connect_store(tmp_path / "metrics") as con:
        runs = [r for (r,) in con.execute("SELECT DISTINCT run_id FROM file_tokens ORDER BY 1").fetchall()]
    assert runs == ["run-a", "run-b"]
    assert sorted(p.name for p in (tmp_path / "imported").iterdir()) == [
        f"{run}-train_data_step{step}.parquet" for run in ("run-a", "run-b") for step in (1, 2)
    ]

    named = DumpImporter("nemo-rl", tmp_path / "named", "mine")
    entries = sorted(Lister([tmp_path / "logs"]).scan(), key=lambda e: e.path)
    logs, lines = named.convert(entries)
    assert [p.name for p in logs] == ["mine-train_data_step1.parquet", "mine-train_data_step2.parquet"]
    assert len(lines) == 2 and all("not imported: --run-id mine names one run" in line for line in lines)
    assert all(line.startswith(str(tmp_path / "logs" / "run-b")) for line in lines)
