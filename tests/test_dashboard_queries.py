"""The dashboard's named queries, without Streamlit: numbers against the raw logs and the public views,
filters, raw-log reads for the token inspector, and reading while another process holds the write lock."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import duckdb
import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from dashboard import inspector_queries, queries
from dashboard.queries import Filters
from evaluator.errors import StoreError
from evaluator.store import connect_store
from evaluator.store import reader as store_reader
from evaluator.store.lake import attach, locate
from schemas.store import METHODS, STORE_DDL

ESTIMATORS = tuple(m for m in METHODS if m != "ground_truth")


def _raw_logs(db: Path):
    with connect_store(db) as con:
        paths = [row[0] for row in con.execute("SELECT path FROM ingested_file ORDER BY file_id").fetchall()]
    return pq.ParquetDataset(paths).read()


class TestStoreOverview:
    def test_tokens_steps_and_staleness_match_the_raw_logs(self, fixture_store):
        raw = _raw_logs(fixture_store)
        runs = queries.store_overview(fixture_store).set_index("run_id")
        assert sorted(runs.index) == ["loglinear", "recompute"]
        for run_id, row in runs.iterrows():
            mine = raw.filter(pc.and_(pc.equal(raw["run_id"], run_id), raw["loss_mask"]))
            steps = mine["step"].to_numpy()
            staleness = steps - mine["behave_version"].to_numpy()
            assert row["n_tokens"] == mine.num_rows
            assert row["n_prox"] == mine.num_rows - mine["prox_logp"].null_count
            assert (row["first_step"], row["last_step"], row["n_steps"]) == (0, 29, 30)
            assert (row["min_staleness"], row["max_staleness"]) == (staleness.min(), staleness.max())
            assert row["n_files"] == 3

    def test_empty_store_has_no_runs(self, empty_store):
        assert queries.store_overview(empty_store).empty
        assert queries.methods_present(empty_store) == []

    def test_missing_database_and_foreign_file_are_store_errors(self, tmp_path):
        with pytest.raises(StoreError, match="no metrics store at"):
            queries.store_overview(tmp_path / "nope")
        duckdb.connect(str(tmp_path / "other.duckdb")).close()
        with pytest.raises(StoreError, match="not a store folder"):
            queries.store_overview(tmp_path / "other.duckdb")


class TestSummaries:
    def test_headline_is_run_summary(self, fixture_store):
        frame = queries.run_headline(fixture_store, Filters(("recompute",), ESTIMATORS), ("abs_error",))
        with connect_store(fixture_store) as con:
            view = con.execute(
                "SELECT method, n, mean, p50, p90, p99 FROM run_summary WHERE run_id = 'recompute' "
                "AND metric = 'abs_error' AND method <> 'ground_truth' ORDER BY method"
            ).df()
        got = frame.sort_values("method")[view.columns].reset_index(drop=True)
        assert list(got["method"]) == sorted(ESTIMATORS)
        np.testing.assert_allclose(
            got[["n", "mean", "p50", "p90", "p99"]], view[["n", "mean", "p50", "p90", "p99"]]
        )

    def test_by_staleness_filters_runs_methods_and_range(self, fixture_store):
        f = Filters(("recompute",), ("loglinear", "ground_truth"), staleness=(1, 3))
        frame = queries.by_staleness(fixture_store, f, ("abs_error", "drift"))
        assert set(frame["run_id"]) == {"recompute"}
        assert set(frame["method"]) == {"loglinear", "ground_truth"}
        assert set(frame["staleness"]) == {1, 2, 3}
        assert set(frame[frame["method"] == "loglinear"]["metric"]) == {
            "abs_error"
        }  # drift: ground truth only
        assert frame["p90"].notna().all()

    def test_step_range_leaves_exact_moments_without_quantiles(self, fixture_store):
        """Token-weighted mean over steps 5..9 from the finest grain equals the view's by-step rows merged."""
        f = Filters(("recompute",), ("loglinear",), steps=(5, 9))
        frame = queries.by_staleness(fixture_store, f, ("abs_error",))
        assert frame["p50"].isna().all()
        steps = queries.by_step(fixture_store, Filters(("recompute",), ("loglinear",)), ("abs_error",))
        cells = queries.step_staleness(fixture_store, Filters(("recompute",), ("loglinear",)), "abs_error")
        cells = cells[cells["step"].between(5, 9)]
        assert frame["n"].sum() == cells["n"].sum() == steps[steps["step"].between(5, 9)]["n"].sum()
        overall = (frame["n"] * frame["mean"]).sum() / frame["n"].sum()
        by_step = steps[steps["step"].between(5, 9)]
        assert overall == pytest.approx((by_step["n"] * by_step["mean"]).sum() / by_step["n"].sum())
        assert frame["max"].max() == pytest.approx(by_step["max"].max())

    def test_by_step_with_and_without_quantiles_agree_on_moments(self, fixture_store):
        f = Filters(("loglinear",), ("linear", "rollout"))
        full = queries.by_step(fixture_store, f, ("abs_error",))
        fast = queries.by_step(fixture_store, f, ("abs_error",), False)
        assert len(full) == len(fast) == 2 * 15  # the loglinear run records prox_logp on even steps only
        assert fast["p50"].isna().all() and full["p50"].notna().all()
        key = ["method", "step"]
        np.testing.assert_allclose(full.sort_values(key)["mean"], fast.sort_values(key)["mean"])

    def test_one_step_store(self, one_step_store):
        runs = queries.store_overview(one_step_store)
        assert (runs["n_steps"].item(), runs["first_step"].item()) == (1, 8)
        frame = queries.by_step(one_step_store, Filters(("one-step",), ESTIMATORS), ("abs_error",))
        assert len(frame) == len(ESTIMATORS) and set(frame["step"]) == {8}


class TestRawLogs:
    def test_sequence_tokens_are_the_raw_rows(self, fixture_store):
        seqs = inspector_queries.sequences(fixture_store, "recompute", 12)
        assert not seqs.empty and (seqs["n_segments"].diff().dropna() <= 0).all()  # resumed first
        seq_id = int(seqs["seq_id"].iloc[0])
        tokens = inspector_queries.sequence_tokens(fixture_store, "recompute", 12, seq_id)
        raw = _raw_logs(fixture_store).to_pandas()
        raw = raw[(raw["run_id"] == "recompute") & (raw["seq_id"] == seq_id)].sort_values("pos")
        assert len(tokens) == len(raw) == seqs["n_tokens"].iloc[0]
        np.testing.assert_array_equal(tokens["behave_logp"], raw["behave_logp"])
        np.testing.assert_array_equal(tokens["staleness"], raw["step"] - raw["behave_version"])
        assert tokens["behave_version"].nunique() == seqs["n_segments"].iloc[0]

    def test_unreachable_log_is_reported_not_read(self, tmp_path):
        from evaluator.logio import write_log_atomic
        from evaluator.replay.pipeline import replay
        from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps

        log = write_log_atomic(
            synthetic_steps(SyntheticSpec(run_id="moved"), 3, 1), tmp_path / "moved.parquet"
        )
        replay([log], tmp_path / "m", progress=False)
        log.rename(tmp_path / "elsewhere.parquet")
        files = inspector_queries.log_files(tmp_path / "m", "moved", 3)
        assert list(files["reachable"]) == [False]
        assert inspector_queries.sequences(tmp_path / "m", "moved", 3).empty


HOLD_LOCK = """
import sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("BEGIN IMMEDIATE")  # the catalog's write lock, as a writer holds it while it commits
con.execute("CREATE TABLE held (x INTEGER)")
print("locked", flush=True)
sys.stdin.readline()  # held until the test closes stdin (or kills this process)
con.close()
"""


class TestReadingWhileReplayWrites:
    def test_a_writer_holding_the_catalog_never_holds_up_a_read(self, tmp_path, one_step_store, monkeypatch):
        """The catalog is SQLite in WAL mode: a reader reads the last commit while a writer holds the
        write lock, at once (the retry's sleep would fail this test)."""
        db = one_step_store  # the lock holder's transaction is never committed: the store is unchanged

        def sleep(seconds: float) -> None:
            raise AssertionError("the read waited for the writer")

        monkeypatch.setattr(store_reader, "time", SimpleNamespace(monotonic=time.monotonic, sleep=sleep))
        child = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(db / "catalog.sqlite")],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        try:
            assert child.stdout.readline().strip() == "locked"
            assert list(queries.store_overview(db)["run_id"]) == ["one-step"]
            assert not queries.by_staleness(db, Filters(("one-step",)), ("abs_error",)).empty
        finally:
            child.stdin.close()
            child.wait(timeout=60)

    def test_tables_without_a_schema_version_are_not_a_store(self, tmp_path, empty_store):
        data = f"{tmp_path / 'ddl' / 'data'}/"
        with attach(locate(tmp_path / "ddl", data), read_only=False, create=True) as con:
            con.execute("USE store")
            con.execute(STORE_DDL)
        with pytest.raises(StoreError, match="schema version None"):
            queries.store_overview(tmp_path / "ddl")
        assert queries.store_overview(empty_store).empty
