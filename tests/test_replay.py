"""Replay end to end: the public views against an independent numpy computation of DOMAIN.md, and the
ingest guarantees (idempotence, folder re-replay, bad files skipped, a kill mid-replay)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl
import pytest
from click.testing import CliRunner

from evaluator.cli import cli
from evaluator.logio import token_table, write_log_atomic
from evaluator.replay.pipeline import check_and_summarise, replay
from evaluator.store import connect_store
from evaluator.store.commits import CRASH_ENV
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps
from schemas.store import METRIC_TABLE
from tests.reference import (
    QUANTILE_PERCENT,
    decision_figures,
    promised_value,
    reference_values,
    safe_staleness,
    within_promise,
)

TABLES = ("ingested_file", "file_tokens", "metric_moments", "sketch_by_step", "sketch_by_staleness")
KEYS = {"run": ["run_id"], "staleness": ["run_id", "staleness"], "step": ["run_id", "step"]}
VIEWS = {"run": "run_summary", "staleness": "staleness_summary", "step": "step_summary"}


def write_logs(folder: Path) -> list[Path]:
    """Two runs in three files: steps split across files, one run recording prox_logp every other step."""
    a = SyntheticSpec(run_id="run-a", seed=1, tokens_per_step=1024, mean_length=24)
    b = SyntheticSpec(
        run_id="run-b", seed=2, tokens_per_step=1024, mean_length=24, prox_every=2, n_minibatches=2
    )
    return [
        write_log_atomic(synthetic_steps(a, 0, 12), folder / "a-000.parquet"),
        write_log_atomic(synthetic_steps(a, 12, 10), folder / "a-012.parquet"),
        write_log_atomic(synthetic_steps(b, 0, 16), folder / "sub" / "b-000.parquet"),
    ]


@pytest.fixture(scope="module")
def replayed(tmp_path_factory) -> tuple[Path, list[Path]]:
    folder = tmp_path_factory.mktemp("logs")
    files = write_logs(folder)
    report = replay([folder], folder / "metrics")
    assert report.clean and report.n_ingested == 3
    return folder / "metrics", files


@pytest.fixture(scope="module")
def values(replayed) -> pd.DataFrame:
    """Every (token, method, metric) value of the replayed logs, computed in numpy (tests/reference.py)."""
    return reference_values(replayed[1])


def view(db: Path, name: str) -> pd.DataFrame:
    con = connect_store(db)
    try:
        return con.sql(f"SELECT * FROM {name}").df()
    finally:
        con.close()


@pytest.mark.parametrize("by", ["run", "staleness", "step"])
def test_views_agree_with_independent_numpy(replayed, values, by):
    db, _ = replayed
    keys = [*KEYS[by], "method", "metric"]
    grouped = values.groupby(keys)["value"]
    expected = grouped.agg(["count", "mean", "min", "max"])
    for stat in QUANTILE_PERCENT:
        expected[stat] = grouped.agg(lambda v, stat=stat: promised_value(v.to_numpy(), stat))
    got = view(db, VIEWS[by]).set_index(keys).sort_index()
    expected = expected.sort_index()
    assert list(got.index) == list(expected.index)  # the same groups: coverage rules hold
    np.testing.assert_array_equal(got["n"], expected["count"])
    for stat in ("mean", "min", "max"):
        # 1e-9 relative; absolute 1e-12 for values made by cancellation (|exp(x) - exp(y)| near 0), where
        # the linear estimator's stable form and the naive one above differ by a rounding of O(1) terms
        np.testing.assert_allclose(got[stat], expected[stat], rtol=1e-9, atol=1e-12)
    metric = got.index.get_level_values("metric")
    binary = metric.isin([m.name for m in METRIC_TABLE if m.binary])
    for stat in QUANTILE_PERCENT:  # 0/1 metrics: exact, from their mean
        np.testing.assert_array_equal(got.loc[binary, stat], expected.loc[binary, stat])
    moments_only = metric.isin([m.name for m in METRIC_TABLE if not m.sketch and not m.binary])
    assert got.loc[moments_only, ["p50", "p90", "p99"]].isna().all().all()  # no sketch kept
    got, expected = got[~binary & ~moments_only], expected[~binary & ~moments_only]
    for stat in QUANTILE_PERCENT:  # the sketch's promise: 1/128 relative of the value at the exact rank
        outside = [
            (key, value, promised)
            for key, value, promised in zip(got.index, got[stat], expected[stat], strict=True)
            if not within_promise(value, promised)
        ]
        assert not outside, (stat, len(outside), outside[:3])


def test_coverage_rules(replayed):
    db, _ = replayed
    runs = view(db, "run_summary").set_index(["run_id", "method", "metric"])["n"]
    tokens = dict(
        view(db, "run_summary")
        .query("method == 'rollout' and metric == 'approx_logp'")[["run_id", "n"]]
        .values
    )
    # run-b records prox_logp on even steps only: errors count fewer tokens than weights
    assert runs["run-b", "loglinear", "abs_error"] < runs["run-b", "loglinear", "importance_weight"]
    assert runs["run-b", "loglinear", "importance_weight"] == tokens["run-b"]
    assert runs["run-b", "ground_truth", "approx_logp"] == runs["run-b", "loglinear", "abs_error"]
    assert runs["run-a", "loglinear", "abs_error"] == tokens["run-a"]
    assert ("run-a", "loglinear", "drift") not in runs.index and (
        "run-a",
        "ground_truth",
        "drift",
    ) in runs.index


def table_counts(db: Path) -> dict[str, int]:
    con = connect_store(db)
    try:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in TABLES}
    finally:
        con.close()


def test_replaying_again_changes_nothing(replayed):
    db, files = replayed
    before, summary = table_counts(db), view(db, "run_summary")
    report = replay(files, db)
    assert [o.status for o in report.outcomes] == ["already ingested"] * 3
    assert table_counts(db) == before
    pd.testing.assert_frame_equal(view(db, "run_summary"), summary)


def test_folder_replay_ingests_only_new_files(replayed, tmp_path):
    """A folder replayed after one of its files: the other two go in, and the store is the one replay of
    the folder (`replayed`, the same logs) writes."""
    fresh, _ = replayed
    files = write_logs(tmp_path / "logs")
    db = tmp_path / "m"
    assert replay([files[0]], db).n_ingested == 1
    report = replay([tmp_path / "logs"], db)
    assert sorted(o.status for o in report.outcomes) == ["already ingested", "ingested", "ingested"]
    assert table_counts(db) == table_counts(fresh)
    key = ["run_id", "step", "method", "metric"]
    a, b = (view(d, "step_summary").sort_values(key).reset_index(drop=True) for d in (db, fresh))
    pd.testing.assert_frame_equal(a, b)


def bad_log(path: Path) -> Path:
    """A log with three positive log-probs in `behave_logp`."""
    table = synthetic_steps(SyntheticSpec(run_id="bad", tokens_per_step=256), 0, 2).to_pydict()
    table["behave_logp"][:3] = [0.5, 0.25, 1.0]
    return write_log_atomic(token_table(table), path)


def test_bad_file_is_skipped_and_the_others_ingested(tmp_path):
    files = write_logs(tmp_path / "logs")
    bad_log(tmp_path / "logs" / "bad.parquet")
    db = tmp_path / "m"
    result = CliRunner().invoke(cli, ["replay", str(tmp_path / "logs"), "--db", str(db)])
    assert result.exit_code == 1, result.output
    bad_line = next(line for line in result.output.splitlines() if "bad.parquet" in line)
    assert "skipped" in bad_line and "behave_logp" in bad_line and "3 rows" in bad_line
    assert table_counts(db)["ingested_file"] == len(files)
    assert set(view(db, "run_summary")["run_id"]) == {"run-a", "run-b"}


def test_nothing_readable_is_exit_2(tmp_path):
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    result = CliRunner().invoke(cli, ["replay", str(tmp_path), "--db", str(tmp_path / "m")])
    assert result.exit_code == 2 and "could be read" in result.output


def test_non_parquet_input_leaves_no_store_behind(tmp_path):
    """A CSV (or any file that does not open as Parquet) is refused before the store is made: no database,
    no lock file, no folder; each file's line says why, once."""
    (tmp_path / "tokens.csv").write_text("run_id,step\nr,0\n")
    (tmp_path / "cut.parquet").write_bytes(b"PAR1 truncated")
    db = tmp_path / "out" / "m"
    paths = [str(tmp_path / "tokens.csv"), str(tmp_path / "cut.parquet")]
    result = CliRunner().invoke(cli, ["replay", *paths, "--db", str(db)])
    assert result.exit_code == 2, result.output
    assert not (tmp_path / "out").exists()
    assert f"{tmp_path / 'tokens.csv'}: unreadable: not a Parquet file (a CSV file)" in result.output
    assert "docs/token-log.md" in result.output  # where the format is, and how to write it
    assert f"{tmp_path / 'cut.parquet'}: unreadable: cannot open as Parquet (truncated" in result.output
    assert "unreadable: unreadable" not in result.output


def test_missing_path_is_exit_2(tmp_path):
    result = CliRunner().invoke(cli, ["replay", str(tmp_path / "nope"), "--db", str(tmp_path / "m")])
    assert result.exit_code == 2


def test_kill_mid_replay_leaves_the_store_as_before_the_group(replayed, tmp_path):
    """The first file is stored; a replay of all three dies in the commit of the group of the other two:
    the store is as before it (the first file only), and a second replay finishes it: the store of one
    replay of the three (`replayed`, the same logs)."""
    fresh, _ = replayed
    files = write_logs(tmp_path / "logs")
    db = tmp_path / "m"
    replay([files[0]], db)
    only_first = table_counts(db)
    command = [sys.executable, "-m", "evaluator.cli", "replay", str(tmp_path / "logs"), "--db", str(db)]
    # the process dies (os._exit, like kill -9) after registering the group's files, before COMMIT
    env = {**os.environ, CRASH_ENV: f"before-commit:{files[1].name}"}
    crashed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert crashed.returncode == 70, crashed.stderr
    assert table_counts(db) == only_first
    finished = [o.status for o in replay([tmp_path / "logs"], db).outcomes]
    assert finished == ["already ingested", "ingested", "ingested"]
    assert table_counts(db) == table_counts(fresh)


def test_row_order_and_batch_cuts_do_not_change_the_numbers(tmp_path):
    """The shipped pairing takes each token's previous pos from its own sequence, wherever the rows sit:
    rows shuffled within the file, sequences cut by record batches and by worker ranges."""
    spec = SyntheticSpec(run_id="order", tokens_per_step=4096, mean_length=40, resume_fraction=0.6)
    table = synthetic_steps(spec, 8, 3)
    shuffled = table.take(np.random.default_rng(0).permutation(table.num_rows))
    sorted_log = write_log_atomic(table, tmp_path / "sorted" / "log.parquet")
    shuffled_log = write_log_atomic(shuffled, tmp_path / "shuffled" / "log.parquet")
    base = check_and_summarise(sorted_log).summary
    for log, batch_rows, workers in (
        (shuffled_log, 1 << 18, 1),
        (sorted_log, 997, 1),
        (shuffled_log, 997, 3),
    ):
        other = check_and_summarise(log, batch_rows=batch_rows, workers=workers).summary
        assert other.n_tokens == base.n_tokens
        key = ["run_id", "step", "staleness", "method", "metric"]
        a, b = (
            pl.from_arrow(s.moments)
            .with_columns(pl.col("run_id", "method", "metric").cast(pl.String))
            .sort(key)
            for s in (base, other)
        )
        assert a.select(key + ["n", "min", "max"]).equals(b.select(key + ["n", "min", "max"]))
        np.testing.assert_allclose(b["sum"].to_numpy(), a["sum"].to_numpy(), rtol=1e-12, atol=1e-12)
    # and end to end: the shuffled file's views equal the sorted file's (sums to rounding)
    got = {}
    for name, log in (("sorted", sorted_log), ("shuffled", shuffled_log)):
        replay([log], tmp_path / f"{name}-store")
        got[name] = view(tmp_path / f"{name}-store", "staleness_summary").sort_values(
            ["staleness", "method", "metric"]
        )
    pd.testing.assert_frame_equal(
        got["sorted"].reset_index(drop=True), got["shuffled"].reset_index(drop=True), rtol=1e-12
    )
    shipped = got["sorted"].query("method == 'loglinear_shipped' and metric == 'abs_error'")["mean"]
    own = got["sorted"].query("method == 'loglinear' and metric == 'abs_error'")["mean"]
    assert (shipped.to_numpy() != own.to_numpy()).any()  # the pairings differ on this log


def _sums(values: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per keys, method and metric: n, sum and sum of squares of the reference values."""
    frame = values.assign(sq=values["value"] ** 2)
    return frame.groupby([*keys, "method", "metric"]).agg(
        n=("value", "size"), s=("value", "sum"), sq=("sq", "sum")
    )


@pytest.mark.parametrize("keys", [["run_id"], ["run_id", "staleness"]], ids=["run", "staleness"])
def test_decision_and_weight_views_agree_with_independent_numpy(replayed, values, keys):
    db, _ = replayed
    sums = _sums(values, keys).unstack(["method", "metric"])
    by = "_staleness" if len(keys) == 2 else ""
    decisions = view(db, f"decision{by}_summary").set_index([*keys, "method"])
    for (*key, method), row in decisions.iterrows():
        at = tuple(key) if len(key) > 1 else key[0]
        truth_mass = sums.loc[at, ("s", "ground_truth", "grad_weight")]
        assert row["n"] == sums.loc[at, ("n", method, "grad_weight")]
        expected = sums.loc[at, ("s", method, "grad_weight_abs_error")] / truth_mass
        assert row["gradient_mass_error"] == pytest.approx(expected, rel=1e-9)
        for flag in ("clip_flip", "bound_flip", "clip_active", "bound_active"):
            rate = sums.loc[at, ("s", method, flag)] / sums.loc[at, ("n", method, flag)]
            assert row[f"{flag}_rate"] == pytest.approx(rate, rel=1e-12, abs=1e-15)
    weights = view(db, f"weight{by}_summary").set_index([*keys, "method"])
    for (*key, method), row in weights.iterrows():
        at = tuple(key) if len(key) > 1 else key[0]
        n = sums.loc[at, ("n", method, "behave_imp_weight")]
        w, w2 = (
            sums.loc[at, ("s", method, "behave_imp_weight")],
            sums.loc[at, ("sq", method, "behave_imp_weight")],
        )
        r, r2 = (
            sums.loc[at, ("s", method, "behave_approx_kl")],
            sums.loc[at, ("sq", method, "behave_approx_kl")],
        )
        assert row["n"] == n
        assert row["ess_fraction"] == pytest.approx(w * w / (n * w2), rel=1e-9)  # ESS from stored sums
        assert row["chi2"] == pytest.approx(n * w2 / (w * w) - 1, rel=1e-6, abs=1e-12)
        assert (row["kl_k1"], row["kl_k2"]) == pytest.approx((-r / n, r2 / (2 * n)), rel=1e-9, abs=1e-15)
        assert row["kl_k3"] == pytest.approx(w / n - 1 - r / n, rel=1e-6, abs=1e-12)


def test_ess_and_chi2_equal_a_direct_computation(replayed, values):
    """From the raw tokens: ESS = (sum w)^2 / (n sum w^2), chi2 = n sum w^2 / (sum w)^2 - 1."""
    db, _ = replayed
    w = values.query("run_id == 'run-a' and method == 'ground_truth' and metric == 'behave_imp_weight'")[
        "value"
    ]
    w = w.to_numpy()
    row = view(db, "weight_summary").query("run_id == 'run-a' and method == 'ground_truth'").iloc[0]
    assert row["ess_fraction"] == pytest.approx(w.sum() ** 2 / (len(w) * (w**2).sum()), rel=1e-12)
    assert row["chi2"] == pytest.approx(len(w) * (w**2).sum() / w.sum() ** 2 - 1, rel=1e-9)


def test_mismatch_floor_and_safe_staleness(replayed, values):
    db, _ = replayed
    truth = values.query("method == 'ground_truth'")
    means = truth.groupby(["run_id", "staleness", "metric"])["value"].mean().unstack("metric")
    mismatch = view(db, "mismatch_summary").set_index(["run_id", "staleness"]).sort_index()
    for column in ("drift", "prob_drift", "exp_abs_drift"):
        np.testing.assert_allclose(mismatch[column], means.loc[mismatch.index, column], rtol=1e-9)
    floor = means["drift"].xs(0, level="staleness")
    expected_share = np.minimum(
        floor.reindex(mismatch.index.get_level_values(0)).to_numpy() / mismatch["drift"], 1
    )
    np.testing.assert_allclose(mismatch["floor_share"], expected_share, rtol=1e-9)
    # safe staleness by its definition, from per-staleness figures computed in numpy over the logs
    levels = decision_figures(values, ["run_id", "staleness"]).reset_index()
    con = connect_store(db)
    try:
        got = con.sql("SELECT * FROM safe_staleness(max_gradient_mass_error := 0.05, min_tokens := 100)").df()
    finally:
        con.close()
    expected = {
        (run, method): safe_staleness(rows, 0.05, 0.01, 100)
        for (run, method), rows in levels.groupby(["run_id", "method"])
    }
    assert {(r.run_id, r.method): r.safe_staleness for r in got.itertuples()} == expected
    assert len(set(expected.values())) > 1  # the methods differ on this log: the comparison says something


def test_one_small_file_is_checked_and_summarised_while_the_store_opens(replayed, tmp_path, monkeypatch):
    """A replay of one small file into an existing store: the store opens in a thread while the file is
    checked and summarised (the open here waits until the check has begun: run one after the other, it
    would wait in vain); the file goes in as it would otherwise. The same file again: its work, done
    while the store opened, is dropped, and nothing changes."""
    import threading

    from evaluator.replay import pipeline
    from evaluator.store.writer import StoreWriter

    db, files = replayed
    copy = tmp_path / "m"
    shutil.copytree(db, copy)
    new = write_log_atomic(
        synthetic_steps(SyntheticSpec(run_id="run-c", seed=3, tokens_per_step=1024, mean_length=24), 0, 4),
        tmp_path / "c-000.parquet",
    )
    checking, opened_in = threading.Event(), []
    check_file, enter = pipeline.check_file, StoreWriter.__enter__

    def check(path):
        checking.set()
        return check_file(path)

    def open_store(self):
        opened_in.append((threading.current_thread() is threading.main_thread(), checking.wait(60)))
        return enter(self)

    monkeypatch.setattr("evaluator.replay.tasks.check_file", check)
    monkeypatch.setattr(StoreWriter, "__enter__", open_store)
    report = replay([new], copy)
    assert [o.status for o in report.outcomes] == ["ingested"]
    assert opened_in == [(False, True)]  # in another thread, once the check had begun
    before = table_counts(copy)
    checking.clear()
    again = replay([new], copy)
    assert [o.status for o in again.outcomes] == ["already ingested"] and table_counts(copy) == before
    assert opened_in[1] == (False, True)
    fresh = tmp_path / "fresh"
    monkeypatch.undo()
    replay([*files, new], fresh)
    assert table_counts(copy) == table_counts(fresh)
    key = ["run_id", "step", "method", "metric"]
    a, b = (view(d, "step_summary").sort_values(key).reset_index(drop=True) for d in (copy, fresh))
    pd.testing.assert_frame_equal(a, b)
