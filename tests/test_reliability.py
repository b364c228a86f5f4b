"""Reliability, probed as a hostile tester would: valid but extreme values, files replay may not read,
paths that cannot hold a store, kills during the first creation, tampered and crafted stores, control
characters in the data, absurd thresholds. Readers during a replay: `tests/test_readers_during_replay.py`."""

from __future__ import annotations

import os
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
from evaluator.store.writer import CRASH_ENV
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps
from tests.builders import set_column


def logs(folder: Path, n: int = 3, run_id: str = "r", tokens_per_step: int = 512) -> list[Path]:
    spec = SyntheticSpec(run_id=run_id, tokens_per_step=tokens_per_step, mean_length=16)
    return [
        write_log_atomic(synthetic_steps(spec, 4 * i, 4), folder / f"{run_id}-{i}.parquet") for i in range(n)
    ]


def run(*args: str):
    return CliRunner().invoke(cli, [*args])


def table(db: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


class TestExtremeButValidValues:
    def test_log_probs_far_below_minus_750_keep_every_figure_finite(self, tmp_path):
        first, *others = logs(tmp_path / "logs")
        t = pq.read_table(first)
        b = t["behave_logp"].to_numpy().copy()
        g = t["prox_logp"].to_numpy().copy()
        b[::7], g[3::11] = -800.0, -1000.0  # exp(prox - behave) would be exp(800) = inf
        write_log_atomic(set_column(set_column(t, "behave_logp", b), "prox_logp", g), first)
        db = tmp_path / "m.duckdb"
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
        result = run("replay", str(tmp_path / "logs"), "--db", str(tmp_path / "m.duckdb"))
        assert result.exit_code == EXIT_FINDINGS and "2 of 3 files ingested" in result.output

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
            db = tmp_path / f"m{workers}.duckdb"
            report = replay([tmp_path / "logs"], db, workers=workers)
            assert [o.status for o in report.outcomes] == ["ingested", "unreadable", "ingested"]
            assert "Permission denied" in report.outcomes[1].line()

    @pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
    def test_a_file_without_read_permission(self, tmp_path):
        files = logs(tmp_path / "logs")
        files[1].chmod(0)
        result = run("replay", str(tmp_path / "logs"), "--db", str(tmp_path / "m.duckdb"))
        assert result.exit_code == EXIT_FINDINGS and "unreadable" in result.output

    def test_a_worker_that_dies_fails_its_file_only(self, tmp_path, monkeypatch):
        """A file that kills its worker process (here: a worker told to die on it) is reported; the pool
        starts a new worker for the next files."""
        logs(tmp_path / "logs", n=4)
        monkeypatch.setenv("PROXAUDIT_WORKER_EXIT_ON", "r-1.parquet")
        report = replay([tmp_path / "logs"], tmp_path / "m.duckdb", workers=2)
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
        before = Path(target).read_bytes() if Path(target).is_file() else None
        result = run("replay", str(tmp_path / "logs"), "--db", target)
        assert result.exit_code == EXIT_USAGE, result.output
        assert "ingested" not in result.output
        if before is not None:
            assert Path(target).read_bytes() == before

    def test_a_foreign_duckdb_database_is_refused_an_empty_one_adopted(self, tmp_path):
        logs(tmp_path / "logs", n=1)
        foreign, empty = tmp_path / "foreign.duckdb", tmp_path / "empty.duckdb"
        with duckdb.connect(str(foreign)) as con:
            con.execute("CREATE TABLE customers (id INTEGER)")
        duckdb.connect(str(empty)).close()
        result = run("replay", str(tmp_path / "logs"), "--db", str(foreign))
        assert result.exit_code == EXIT_USAGE and "not a proxaudit metrics database" in result.output
        assert table(foreign, "SELECT table_name FROM duckdb_tables()") == [("customers",)]
        assert run("replay", str(tmp_path / "logs"), "--db", str(empty)).exit_code == EXIT_OK


class TestKills:
    def test_a_kill_during_the_first_creation_leaves_no_half_made_store(self, tmp_path):
        files = logs(tmp_path / "logs")
        db = tmp_path / "m.duckdb"
        command = [sys.executable, "-m", "evaluator.cli", "replay", str(tmp_path / "logs"), "--db", str(db)]
        crashed = subprocess.run(command, env={**os.environ, CRASH_ENV: files[0].name}, capture_output=True)
        assert crashed.returncode == 70
        assert not db.exists()  # nothing was published: no store rather than a broken one
        finished = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert finished.returncode == 0, finished.stderr
        assert table(db, "SELECT count(*) FROM ingested_file") == [(3,)]
        assert not list(tmp_path.glob(".m.duckdb.work*")) and not list(tmp_path.glob(".m.duckdb.publish-*"))

    def test_leftovers_of_a_killed_publish_are_cleaned(self, tmp_path):
        logs(tmp_path / "logs", n=1)
        db = tmp_path / "m.duckdb"
        (tmp_path / ".m.duckdb.publish-99999").write_bytes(b"half a copy")
        (tmp_path / ".m.duckdb.work").write_bytes(b"half a working copy")
        assert replay([tmp_path / "logs"], db).n_ingested == 1
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".m.")) == [".m.duckdb.lock"]


@pytest.fixture
def store(tmp_path) -> Path:
    logs(tmp_path / "logs", n=2)
    db = tmp_path / "m.duckdb"
    replay([tmp_path / "logs"], db)
    return db


class TestTamperedAndCraftedStores:
    def test_a_view_where_a_table_should_be_is_a_clear_error(self, store, tmp_path):
        with duckdb.connect(str(store)) as con:
            con.execute("ALTER TABLE metric_moments RENAME TO moments_backup")
            con.execute("CREATE VIEW metric_moments AS SELECT * FROM moments_backup")
        for args in (["summary", "--db", str(store)], ["replay", str(tmp_path / "logs"), "--db", str(store)]):
            result = run(*args)
            assert result.exit_code == EXIT_USAGE and "table metric_moments is a view" in result.output
            assert "Traceback" not in result.output

    def test_a_crafted_view_never_runs_and_files_stay_unread(self, store, tmp_path):
        secret = tmp_path / "secret.csv"
        secret.write_text("run_id,method,metric,n,mean,min,max,p50,p90,p99\nSECRET,x,y,1,1,1,1,1,1,1\n")
        with duckdb.connect(str(store)) as con:
            con.execute(f"CREATE OR REPLACE VIEW run_summary AS SELECT * FROM read_csv('{secret}')")
        result = run("summary", "--db", str(store))
        assert result.exit_code == EXIT_OK and "SECRET" not in result.output and "loglinear" in result.output
        result = run("query", "--db", str(store), f"SELECT * FROM read_csv('{secret}')")
        assert result.exit_code == EXIT_USAGE and "SECRET" not in result.output

    def test_the_token_inspector_opens_only_the_bytes_replay_read(self, store, tmp_path):
        from dashboard import queries

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


class TestReports:
    NASTY = "run\x1b[31m-red\x07\x00"

    def test_control_characters_never_reach_the_terminal_or_break_junit(self, tmp_path):
        t = synthetic_steps(SyntheticSpec(run_id="x", tokens_per_step=1024, mean_length=16), 4, 4)
        nasty = t.set_column(0, "run_id", pa.array([self.NASTY] * t.num_rows))
        write_log_atomic(nasty, tmp_path / "logs" / "nasty.parquet")
        db = tmp_path / "m.duckdb"
        assert run("replay", str(tmp_path / "logs"), "--db", str(db)).exit_code == EXIT_OK
        reports = ["--junit", str(tmp_path / "j.xml"), "--markdown", str(tmp_path / "g.md")]
        for args in (["summary", "--db", str(db)], ["gate", "--db", str(db), *reports]):
            output = run(*args).output
            assert "\x1b" not in output and "\x00" not in output and "\\x1b[31m" in output
        cases = ET.parse(tmp_path / "j.xml").getroot().iter("testcase")  # well-formed XML
        assert any("\\x1b" in case.get("classname") for case in cases)
        assert "\x1b" not in (tmp_path / "g.md").read_text()

    @pytest.mark.parametrize("value", ["1e308", "-1e308", "1e101"])
    def test_absurd_thresholds_are_exit_2(self, store, tmp_path, value):
        gate = tmp_path / "gate.toml"
        gate.write_text(
            f'[[check]]\nmethod = "loglinear"\nmetric = "abs_error"\nstat = "mean"\nmax = {value}\n'
        )
        result = run("gate", "--db", str(store), "--thresholds", str(gate))
        assert result.exit_code == EXIT_USAGE and "beyond +-1e+100" in result.output
