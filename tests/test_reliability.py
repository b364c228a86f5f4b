"""Reliability, probed as a hostile tester would: valid but extreme values, files replay may not read,
paths that cannot hold a store, kills during the first creation, tampered and crafted stores, control
characters in the data, absurd thresholds. Readers during a replay: `tests/test_readers_during_replay.py`."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from evaluator.cli import cli
from evaluator.cli.common import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from evaluator.logio import write_log_atomic
from evaluator.replay import slots as replay_slots
from evaluator.replay.batch import group_tokens
from evaluator.replay.pipeline import replay
from evaluator.store import connect_store
from evaluator.store.commits import CRASH_ENV
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps
from tests.builders import set_column


def logs(folder: Path, n: int = 3, run_id: str = "r", tokens_per_step: int = 512) -> list[Path]:
    spec = SyntheticSpec(run_id=run_id, tokens_per_step=tokens_per_step, mean_length=16)
    return [
        write_log_atomic(synthetic_steps(spec, 4 * i, 4), folder / f"{run_id}-{i}.parquet") for i in range(n)
    ]


def run(*args: str):
    return CliRunner().invoke(cli, [*args])


def folder_bytes(folder: Path) -> list[tuple[Path, bytes]]:
    """Every file under `folder` with its bytes."""
    return sorted((p, p.read_bytes()) for p in folder.rglob("*") if p.is_file())


def table(db: Path, sql: str) -> list[tuple]:
    with connect_store(db) as con:
        return con.execute(sql).fetchall()


class TestExtremeButValidValues:
    def test_log_probs_far_below_minus_750_keep_every_figure_finite(self, tmp_path):
        first, *others = logs(tmp_path / "logs")
        t = pq.read_table(first)
        b = t["behave_logp"].to_numpy().copy()
        g = t["prox_logp"].to_numpy().copy()
        b[::7], g[3::11] = -800.0, -1000.0  # exp(prox - behave) would be exp(800) = inf
        write_log_atomic(set_column(set_column(t, "behave_logp", b), "prox_logp", g), first)
        db = tmp_path / "m"
        report = replay([tmp_path / "logs"], db)
        assert [o.status for o in report.outcomes] == ["ingested"] * 3
        bad = table(db, "SELECT count(*) FROM metric_moments WHERE NOT (isfinite(sum) AND isfinite(sum_sq) "
                        "AND isfinite(min) AND isfinite(max))")  # fmt: skip
        assert bad == [(0,)]
        weights = table(db, "SELECT max(max) FROM run_summary WHERE metric = 'behave_imp_weight'")[0][0]
        assert weights == pytest.approx(np.exp(150.0))  # capped by the stated rule, not inf

    def test_staleness_beyond_32_bits_is_a_rule_not_a_crash(self, tmp_path):
        logs(tmp_path / "logs", n=2)
        t = synthetic_steps(SyntheticSpec(run_id="far", tokens_per_step=256, mean_length=16), 4, 1)
        far = set_column(t, "step", pc_add(t["step"], 2**31 + 10))
        write_log_atomic(far, tmp_path / "logs" / "far.parquet")
        result = run("validate", str(tmp_path / "logs" / "far.parquet"))
        assert result.exit_code == EXIT_FINDINGS and "staleness_out_of_range" in result.output
        result = run("replay", str(tmp_path / "logs"), "--db", str(tmp_path / "m"))
        assert result.exit_code == EXIT_FINDINGS and "2 of 3 files ingested" in result.output

    def test_a_file_without_rows_is_valid_and_ingested_as_empty_by_both(self, tmp_path):
        """Decided once: a zero-row file with the schema is valid (a writer that flushed an empty buffer)
        and replay records it without a token, so a second replay calls it already ingested."""
        logs(tmp_path / "logs", n=1)
        t = synthetic_steps(SyntheticSpec(run_id="r", tokens_per_step=256, mean_length=16), 40, 1)
        empty = write_log_atomic(t.slice(0, 0), tmp_path / "logs" / "empty.parquet")
        result = run("validate", "-v", str(empty))
        assert result.exit_code == EXIT_OK and "empty file: no tokens" in result.output
        db = tmp_path / "m"
        result = run("replay", str(tmp_path / "logs"), "--db", str(db))
        assert result.exit_code == EXIT_OK, result.output
        assert f"{empty}: ingested (0 loss tokens of 0 rows)" in result.output
        assert "2 of 2 files ingested" in result.output
        assert table(db, "SELECT n_rows, n_tokens FROM ingested_file WHERE path LIKE '%empty.parquet'") == [
            (0, 0)
        ]
        assert table(db, "SELECT DISTINCT run_id FROM file_tokens") == [("r",)]
        again = run("replay", str(empty), "--db", str(db))
        assert again.exit_code == EXIT_OK and "already ingested" in again.output

    def test_far_apart_steps_group_like_near_ones(self, tmp_path):
        """Steps 0 and 3e9 in two runs would overflow one int64 key: the same groups as small steps."""
        run_ = np.array([0, 1, 1, 0, 1])
        staleness = np.array([0, 2_000_000_000, 5, 3, 5])
        far = np.array([0, 3_000_000_000, 3_000_000_000, 0, 7])
        near = np.array([0, 2, 2, 0, 1])
        order_far, groups_far = group_tokens(run_, far, staleness)
        order_near, groups_near = group_tokens(run_, near, staleness)
        np.testing.assert_array_equal(order_far, order_near)
        np.testing.assert_array_equal(groups_far.group, groups_near.group)
        assert groups_far.cells.labels["step"].tolist() == [0, 0, 7, 3_000_000_000, 3_000_000_000]


class TestUnboundedStrings:
    """The store repeats a run's id on every row of its summaries: a long one is refused by a rule, named
    with the file and the column, before anything is summarised (replay of a 576-row file with a
    20,000-character run_id peaked at 4.3 GB; BENCHMARKS.md)."""

    def test_a_run_id_beyond_200_bytes_is_a_rule_in_validate_and_replay(self, tmp_path):
        logs(tmp_path / "logs", n=1)
        t = synthetic_steps(SyntheticSpec(run_id="x", tokens_per_step=64, mean_length=16), 4, 9).slice(0, 576)
        for name, run_id in {"long": "r" * 20_000, "euro": "\u20ac" * 67, "accent": "\u00e9" * 100}.items():
            write_log_atomic(
                set_column(t, "run_id", pa.array([run_id] * 576)), tmp_path / "logs" / f"{name}.parquet"
            )
        long = tmp_path / "logs" / "long.parquet"
        result = run("validate", str(long))
        assert result.exit_code == EXIT_FINDINGS
        assert f"{long}" in result.output and "run_id_too_long" in result.output
        assert "at most 200 bytes" in result.output and "worst found 20000" in result.output
        assert "pos_gap" not in result.output and "r" * 300 not in result.output
        result = run("replay", str(tmp_path / "logs"), "--db", str(tmp_path / "m"))
        assert result.exit_code == EXIT_FINDINGS
        lines = {line.split(":")[0]: line for line in result.output.splitlines()}
        assert "skipped: run_id_too_long on run_id (576 rows)" in lines[str(long)]
        assert (
            "skipped: run_id_too_long on run_id (576 rows)" in lines[str(tmp_path / "logs" / "euro.parquet")]
        )
        stored = table(tmp_path / "m", "SELECT DISTINCT run_id FROM file_tokens ORDER BY 1")
        assert stored == [("r",), ("\u00e9" * 100,)]  # 200 bytes: within the limit


def _read(fd: int) -> bytes:
    """The next bytes from a pty's leader side; b"" once the child has closed it."""
    try:
        return os.read(fd, 65536)
    except OSError:  # EIO: no writer left
        return b""


def pc_add(column: pa.ChunkedArray, k: int) -> pa.Array:
    return pa.array(column.to_numpy() + k, pa.int64())


class TestFilesReplayMayNotRead:
    def test_an_unreadable_file_is_reported_and_the_others_ingested(self, tmp_path, monkeypatch):
        files = logs(tmp_path / "logs")
        real = replay_slots.file_digest

        def denied(path):
            if Path(path) == files[1]:
                raise PermissionError(13, "Permission denied", str(path))
            return real(path)

        monkeypatch.setattr(replay_slots, "file_digest", denied)  # the digest phase
        for workers in (1, 2):
            db = tmp_path / f"m{workers}"
            report = replay([tmp_path / "logs"], db, workers=workers)
            assert [o.status for o in report.outcomes] == ["ingested", "unreadable", "ingested"]
            assert "Permission denied" in report.outcomes[1].line()

    @pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
    def test_a_file_without_read_permission(self, tmp_path):
        files = logs(tmp_path / "logs")
        files[1].chmod(0)
        result = run("replay", str(tmp_path / "logs"), "--db", str(tmp_path / "m"))
        assert result.exit_code == EXIT_FINDINGS and "unreadable" in result.output

    def test_a_worker_that_dies_fails_its_file_only(self, tmp_path, monkeypatch):
        """A file that kills its worker process (here: a worker told to die on it) is reported; the pool
        starts a new worker for the next files."""
        logs(tmp_path / "logs", n=4)
        monkeypatch.setenv("PROXAUDIT_WORKER_EXIT_ON", "r-1.parquet")
        report = replay([tmp_path / "logs"], tmp_path / "m", workers=2)
        assert [o.status for o in report.outcomes] == ["ingested", "failed", "ingested", "ingested"]
        assert "worker process exited" in report.outcomes[1].line()


class TestPathsThatCannotHoldAStore:
    @pytest.mark.parametrize("kind", [":memory:", "parquet", "csv", "folder"])
    def test_refused_with_exit_2_and_untouched(self, tmp_path, kind):
        logs(tmp_path / "logs", n=1)
        target = {
            ":memory:": ":memory:",
            "parquet": str(logs(tmp_path / "other", n=1, run_id="x")[0]),
            "csv": str(tmp_path / "m.csv"),
            "folder": str(tmp_path / "dir"),
        }[kind]
        (tmp_path / "m.csv").write_text("run_id,step\nr,1\n")
        (tmp_path / "dir").mkdir()
        (tmp_path / "dir" / "notes.txt").write_text("a folder of the user's files")
        before = Path(target).read_bytes() if Path(target).is_file() else None
        result = run("replay", str(tmp_path / "logs"), "--db", target)
        assert result.exit_code == EXIT_USAGE, result.output
        assert "ingested" not in result.output
        if before is not None:
            assert Path(target).read_bytes() == before

    @pytest.mark.parametrize("where", ["/proc/no-such-folder/m", "/proc/m", "/sys/m"])
    def test_an_unwritable_place_is_exit_2_naming_it(self, tmp_path, where):
        logs(tmp_path / "logs", n=1)
        result = run("replay", str(tmp_path / "logs"), "--db", where)
        assert result.exit_code == EXIT_USAGE, result.output
        assert f"--db {where}: cannot write a store there: " in result.output
        assert "Traceback" not in result.output and not isinstance(result.exception, OSError)

    @pytest.mark.skipif(os.geteuid() == 0, reason="root writes whatever a folder's mode")
    def test_a_read_only_folder_is_exit_2_and_the_store_untouched(self, tmp_path):
        logs(tmp_path / "logs", n=1)
        (tmp_path / "ro").mkdir()
        (tmp_path / "ro").chmod(0o555)
        try:
            result = run("replay", str(tmp_path / "logs"), "--db", str(tmp_path / "ro" / "m"))
            assert result.exit_code == EXIT_USAGE and "Permission denied" in result.output, result.output
            (tmp_path / "ro").chmod(0o755)
            assert run("replay", str(tmp_path / "logs"), "--db", str(tmp_path / "ro" / "m")).exit_code == 0
            before = folder_bytes(tmp_path / "ro")
            logs(tmp_path / "logs", n=2)
            (tmp_path / "ro").chmod(0o555)  # a store there already, the folder read-only since
            result = run("replay", str(tmp_path / "logs"), "--db", str(tmp_path / "ro" / "m"))
            assert result.exit_code == EXIT_USAGE and "cannot write a store there" in result.output
            assert folder_bytes(tmp_path / "ro") == before
        finally:
            (tmp_path / "ro").chmod(0o755)

    def test_a_report_that_cannot_be_written_is_exit_2(self, store):
        result = run("gate", "--db", str(store), "--junit", "/proc/no-such-folder/gate.xml")
        assert result.exit_code == EXIT_USAGE and "/proc/no-such-folder" in result.output, result.output
        assert not isinstance(result.exception, OSError)

    def test_a_duckdb_database_file_is_refused_untouched(self, tmp_path):
        logs(tmp_path / "logs", n=1)
        foreign = tmp_path / "foreign.duckdb"
        with duckdb.connect(str(foreign)) as con:
            con.execute("CREATE TABLE customers (id INTEGER)")
        before = foreign.read_bytes()
        result = run("replay", str(tmp_path / "logs"), "--db", str(foreign))
        assert result.exit_code == EXIT_USAGE and "not a store folder" in result.output
        assert f"proxaudit store convert {foreign} NEW_FOLDER" in result.output
        assert foreign.read_bytes() == before


class TestKills:
    def test_a_kill_during_the_first_commit_leaves_an_empty_store(self, tmp_path):
        files = logs(tmp_path / "logs")
        db = tmp_path / "m"
        command = [sys.executable, "-m", "evaluator.cli", "replay", str(tmp_path / "logs"), "--db", str(db)]
        env = {**os.environ, CRASH_ENV: f"before-commit:{files[0].name}"}
        crashed = subprocess.run(command, env=env, capture_output=True)
        assert crashed.returncode == 70
        assert table(db, "SELECT count(*) FROM ingested_file") == [(0,)]  # a store, with nothing half-made
        finished = run("replay", str(tmp_path / "logs"), "--db", str(db))  # the next replay, in-process
        assert finished.exit_code == EXIT_OK, finished.output
        assert table(db, "SELECT count(*) FROM ingested_file") == [(3,)]


def replayed(folder: Path) -> Path:
    """Two logs of run `r` under `folder / "logs"`, replayed into the store `folder / "m"`."""
    logs(folder / "logs", n=2)
    replay([folder / "logs"], folder / "m")
    return folder / "m"


@pytest.fixture(scope="module")
def store_made_once(tmp_path_factory) -> Path:
    return replayed(tmp_path_factory.mktemp("store"))


@pytest.fixture
def store(store_made_once, tmp_path) -> Path:
    """`replayed`'s store, a copy of its own for each test (a store folder copies whole), beside a copy of
    its logs (the store records the paths of the logs it was made from, not of these copies)."""
    shutil.copytree(store_made_once.parent / "logs", tmp_path / "logs")
    return Path(shutil.copytree(store_made_once, tmp_path / "m"))


class TestTamperedAndCraftedStores:
    def test_a_view_where_a_table_should_be_is_a_clear_error(self, store, tmp_path):
        with connect_store(store, read_only=False) as con:
            con.execute("ALTER TABLE metric_moments RENAME TO moments_backup")
            con.execute("CREATE VIEW metric_moments AS SELECT * FROM moments_backup")
        for args in (["summary", "--db", str(store)], ["replay", str(tmp_path / "logs"), "--db", str(store)]):
            result = run(*args)
            assert result.exit_code == EXIT_USAGE and "table metric_moments is a view" in result.output
            assert "Traceback" not in result.output

    def test_a_crafted_view_never_runs_and_files_stay_unread(self, store, tmp_path):
        secret = tmp_path / "secret.csv"
        secret.write_text("run_id,method,metric,n,mean,min,max,p50,p90,p99\nSECRET,x,y,1,1,1,1,1,1,1\n")
        with connect_store(store, read_only=False) as con:
            con.execute(f"CREATE OR REPLACE VIEW run_summary AS SELECT * FROM read_csv('{secret}')")
        result = run("summary", "--db", str(store))
        assert result.exit_code == EXIT_OK and "SECRET" not in result.output and "loglinear" in result.output
        result = run("query", "--db", str(store), f"SELECT * FROM read_csv('{secret}')")
        assert result.exit_code == EXIT_USAGE and "SECRET" not in result.output

    @pytest.mark.parametrize(
        "table, change, says",
        [
            (
                "sketch_by_step",
                "run_id = repeat('r', 20000)",
                "sketch_by_step.run_id are longer than 200 bytes",
            ),
            ("metric_moments", "method = '<a href=\"https://evil.example\">x</a>'", "not a method"),
            ("sketch_by_staleness", "metric = 'x'", "sketch_by_staleness.metric are not a metric"),
            ("ingested_file", "digest = '../../etc' || file_id", "not a BLAKE2b digest"),
            ("run_finding", "message = repeat('m', 9000)", "run_finding.message are over 8192 bytes"),
        ],
    )
    def test_values_replay_never_writes_are_refused(self, store, tmp_path, table, change, says):
        """A crafted store repeating a long or foreign value on every row would cost readers memory per
        row (a 20,000-character run_id compresses to nothing on disk) and put foreign names on charts."""
        from dashboard import queries

        with connect_store(store, read_only=False) as con:
            con.execute(
                "INSERT INTO run_finding (run_id, rule, column_name, n_rows, message, found_at, threshold, "
                "examples, advice) VALUES ('r', 'some_rule', NULL, 1, 'm', now(), '', '', '')"
            )
            con.execute(f"UPDATE {table} SET {change} WHERE rowid IN (SELECT rowid FROM {table} LIMIT 3)")
        for args in (["summary", "--db", str(store)], ["replay", str(tmp_path / "logs"), "--db", str(store)]):
            result = run(*args)
            assert result.exit_code == EXIT_USAGE and says in result.output, result.output
        with pytest.raises(queries.StoreError, match=says):
            queries.store_overview(store)

    def test_the_token_inspector_opens_only_the_bytes_replay_read(self, tmp_path):
        from dashboard import inspector_queries as queries

        store = replayed(tmp_path)  # its own logs: the test writes another log where the store says one is
        (path, step) = table(store, "SELECT f.path, min(t.step) FROM ingested_file f JOIN file_tokens t "
                                    "USING (file_id) GROUP BY ALL ORDER BY 1 LIMIT 1")[0]  # fmt: skip
        assert queries.log_files(store, "r", step)["reachable"].all()
        original = Path(path).read_bytes()
        other = synthetic_steps(
            SyntheticSpec(run_id="r", seed=9, tokens_per_step=512, mean_length=16), step, 1
        )
        write_log_atomic(other, path)  # another log under the recorded path
        try:
            assert not queries.log_files(store, "r", step)["reachable"].any()
            assert queries.sequences(store, "r", step).empty
        finally:
            Path(path).write_bytes(original)

    def test_the_inspector_hashes_no_file_but_a_parquet_file_of_the_recorded_rows(
        self, store, tmp_path, monkeypatch
    ):
        """A crafted store's paths are data: relative, `file://`, a folder, a device, a file that is not
        Parquet or has another row count are not reachable, and none of them is read whole."""
        from dashboard import inspector_queries as queries
        from dashboard import raw_logs

        hashed = []
        monkeypatch.setattr(raw_logs, "file_digest", lambda path: hashed.append(path) or "0" * 64)
        other = logs(tmp_path / "other", n=1, run_id="o", tokens_per_step=256)[0]
        (tmp_path / "big.bin").write_bytes(b"x" * 100_000)
        for path in ["logs/r-0.parquet", f"file://{tmp_path}/logs/r-0.parquet", str(tmp_path), "/dev/zero",
                     str(tmp_path / "big.bin"), str(other), f"{tmp_path}/logs/r-*.parquet"]:  # fmt: skip
            with connect_store(store, read_only=False) as con:
                con.execute("UPDATE ingested_file SET path = ?", [path])
            assert not queries.log_files(store, "r", 4)["reachable"].any(), path
        assert hashed == []


class TestMachineReadableOutput:
    # Every DuckDB connection of the child runs its queries as slowly as under load (DuckDB shows its
    # progress bar after 1 ms instead of 2 s) from its first statement that is not a SET: the caller may
    # configure it first, as `evaluator.duck.connect` does (a SET would print the bar itself if it took 1 ms).
    SLOW = """
import sys, duckdb
real = duckdb.connect
class Loaded:
    def __init__(self, con):
        self._con, self._loaded = con, False
    def _load(self, sql):
        if not self._loaded and not str(sql).lstrip().upper().startswith("SET"):
            self._con.execute("SET progress_bar_time = 1")
            self._loaded = True
    def execute(self, sql, *args, **kwargs):
        self._load(sql)
        self._con.execute(sql, *args, **kwargs)
        return self
    def sql(self, sql, *args, **kwargs):
        self._load(sql)
        return self._con.sql(sql, *args, **kwargs)
    def __getattr__(self, name):
        return getattr(self._con, name)
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self._con.close()
duckdb.connect = lambda *args, **kwargs: Loaded(real(*args, **kwargs))
from evaluator.cli.main import main
sys.argv[0] = "proxaudit"
main()
"""

    def proxaudit_under_load(self, *args: str) -> str:
        done = subprocess.run([sys.executable, "-c", self.SLOW, *args], capture_output=True, text=True)
        assert done.returncode in (EXIT_OK, EXIT_FINDINGS), done.stderr
        return done.stdout

    def test_json_and_csv_carry_nothing_but_their_format(self, store, tmp_path):
        slow_sql = "SELECT count(*) AS n FROM range(20000000) t(x) WHERE x % 7 = 1"
        for args in (["summary", "--db", str(store), "--format", "json"],
                     ["summary", "--db", str(store), "--by", "decision", "--format", "json"],
                     ["query", "--db", str(store), "--format", "json", slow_sql],
                     ["validate", str(tmp_path / "logs"), "--format", "json"]):  # fmt: skip
            json.loads(self.proxaudit_under_load(*args))
        text = self.proxaudit_under_load("summary", "--db", str(store), "--format", "csv")
        rows = list(csv.reader(io.StringIO(text)))
        assert rows[0][:3] == ["run_id", "method", "metric"] and all(len(r) == len(rows[0]) for r in rows)

    def test_every_connection_we_open_goes_through_duck_connect(self):
        repo = Path(__file__).resolve().parents[1]
        sources = [*repo.glob("evaluator/**/*.py"), *repo.glob("dashboard/**/*.py")]
        # the one exception: the readers benchmark's "raw duckdb" reader is a user's own connection
        own = {repo / "evaluator" / "duck.py", repo / "evaluator" / "bench" / "readers.py"}
        assert [p for p in sources if p not in own and "duckdb.connect(" in p.read_text()] == []


class TestReports:
    # C0 and C1 controls (U+009B is a CSI on many terminals), a bidi override and isolate, a zero width, a
    # line separator; then what Markdown would make a link of (a NUL byte the store refuses: below)
    NASTY = (
        "run\x1b[31m-red\x07\x9b31m\u202edne\u2066\u200b\u2028 https://evil.example [x](https://e.example)"
    )
    RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\u2066", "\u200b", "\u2028")

    def test_a_run_id_with_a_nul_byte_is_refused_by_the_store(self, tmp_path):
        t = synthetic_steps(SyntheticSpec(run_id="x", tokens_per_step=1024, mean_length=16), 4, 2)
        nul = t.set_column(0, "run_id", pa.array(["a\x00b"] * t.num_rows))
        write_log_atomic(nul, tmp_path / "n.parquet")
        result = run("replay", str(tmp_path / "n.parquet"), "--db", str(tmp_path / "m"))
        assert result.exit_code == EXIT_FINDINGS and "unstorable_text on run_id" in result.output, (
            result.output
        )
        assert table(tmp_path / "m", "SELECT count(*) FROM ingested_file") == [(0,)]

    SPELLED = ("\\x1b[31m", "\\x9b31m", "\\u202e", "\\u2066", "\\u200b", "\\u2028")

    def test_control_and_format_characters_never_reach_the_terminal_or_break_reports(self, tmp_path):
        t = synthetic_steps(SyntheticSpec(run_id="x", tokens_per_step=1024, mean_length=16), 4, 4)
        nasty = t.set_column(0, "run_id", pa.array([self.NASTY] * t.num_rows))
        write_log_atomic(nasty, tmp_path / "logs" / "nasty.parquet")
        db = tmp_path / "m"
        assert run("replay", str(tmp_path / "logs"), "--db", str(db)).exit_code == EXIT_OK
        reports = ["--junit", str(tmp_path / "j.xml"), "--markdown", str(tmp_path / "g.md")]
        for args in (
            ["summary", "--db", str(db)],
            ["gate", "--db", str(db), *reports],
            ["query", "--db", str(db), "SELECT DISTINCT run_id FROM run_summary"],
        ):
            output = run(*args).output
            assert not any(c in output for c in self.RAW), args[0]
            assert all(c in output for c in self.SPELLED), args[0]
        cases = ET.parse(tmp_path / "j.xml").getroot().iter("testcase")  # well-formed XML
        assert any("\\x9b31m" in case.get("classname") for case in cases)
        markdown = (tmp_path / "g.md").read_text()
        assert not any(c in markdown for c in self.RAW)
        # the run is a code span in the table (GitHub renders the step summary: no link, no image)
        assert "` run\\x1b[31m-red" in markdown and "example) ` |" in markdown

    def test_csv_is_exact_into_a_pipe_and_spelled_out_on_a_terminal(self, tmp_path):
        """CSV is data for a program, byte for byte (click stripped escape sequences from it); on a
        terminal its control characters are spelled out, as a table's are."""
        import pty

        t = synthetic_steps(SyntheticSpec(run_id="x", tokens_per_step=1024, mean_length=16), 4, 2)
        write_log_atomic(set_column(t, "run_id", pa.array([self.NASTY] * t.num_rows)), tmp_path / "n.parquet")
        db = tmp_path / "m"
        replay([tmp_path / "n.parquet"], db)
        command = [sys.executable, "-m", "evaluator.cli", "summary", "--db", str(db), "--format", "csv"]
        piped = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        assert {row[0] for row in list(csv.reader(io.StringIO(piped)))[1:]} == {self.NASTY}  # exact
        leader, follower = pty.openpty()
        with subprocess.Popen(command, stdout=follower, stderr=subprocess.DEVNULL):
            os.close(follower)
            shown = b""
            while chunk := _read(leader):
                shown += chunk
        os.close(leader)
        text = shown.decode()
        assert not any(c in text for c in self.RAW) and all(c in text for c in self.SPELLED)

    @pytest.mark.parametrize("value", ["1e308", "-1e308", "1e101"])
    def test_absurd_thresholds_are_exit_2(self, store, tmp_path, value):
        gate = tmp_path / "gate.toml"
        gate.write_text(
            f'[[check]]\nmethod = "loglinear"\nmetric = "abs_error"\nstat = "mean"\nmax = {value}\n'
        )
        result = run("gate", "--db", str(store), "--thresholds", str(gate))
        assert result.exit_code == EXIT_USAGE and "beyond +-1e+100" in result.output
