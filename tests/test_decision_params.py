"""The loss's thresholds of the decision metrics (eps_low, eps_high, U, bound action): given to `replay`
by flags and/or a TOML file, recorded in the store, and never mixed in one store."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from evaluator.cli import cli
from evaluator.cli.common import EXIT_OK, EXIT_USAGE
from evaluator.logio import write_log_atomic
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps
from tests.reference import BINARY, decision_figures, reference_values


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("params")
    spec = SyntheticSpec(run_id="p", tokens_per_step=2048, mean_length=24, drift=0.4)  # a fast policy
    write_log_atomic(synthetic_steps(spec, 8, 3), folder / "p.parquet")
    return folder


def replay(*args: str):
    return CliRunner().invoke(cli, ["replay", *args])


def stored(db: Path) -> dict:
    with duckdb.connect(str(db), read_only=True) as con:
        row = con.execute("SELECT value FROM store_meta WHERE key = 'decision_params'").fetchone()
    return json.loads(row[0])


def grad_mass(db: Path) -> float:
    with duckdb.connect(str(db), read_only=True) as con:
        sql = "SELECT mean FROM run_summary WHERE method = 'ground_truth' AND metric = 'grad_weight'"
        return con.execute(sql).fetchone()[0]


def test_defaults_are_recorded(logs, tmp_path):
    db = tmp_path / "m.duckdb"
    assert replay(str(logs), "--db", str(db)).exit_code == EXIT_OK
    assert stored(db) == {"eps_low": 0.2, "eps_high": 0.2, "bound": 5.0, "bound_action": "mask"}


def test_a_store_of_other_parameters_is_refused(logs, tmp_path):
    db = tmp_path / "m.duckdb"
    assert replay(str(logs), "--db", str(db), "--bound", "3").exit_code == EXIT_OK
    before = stored(db), grad_mass(db)
    result = replay(str(logs), "--db", str(db))  # the defaults, U = 5
    assert result.exit_code == EXIT_USAGE
    assert "bound 3 (mask)" in result.output and "bound 5 (mask)" in result.output
    assert (stored(db), grad_mass(db)) == before
    assert replay(str(logs), "--db", str(db), "--bound", "3").exit_code == EXIT_OK  # the same: fine


def test_toml_file_and_flags(logs, tmp_path):
    params = tmp_path / "loss.toml"
    params.write_text('eps_low = 0.1\neps_high = 0.28\nbound = 2.0\nbound_action = "clamp"\n')
    db = tmp_path / "m.duckdb"
    result = replay(str(logs), "--db", str(db), "--params", str(params), "--bound", "4")
    assert result.exit_code == EXIT_OK, result.output
    assert stored(db) == {"eps_low": 0.1, "eps_high": 0.28, "bound": 4.0, "bound_action": "clamp"}


@pytest.mark.parametrize(
    "text, message",
    [
        ("eps = 0.2\n", "unknown key 'eps'"),
        ("eps_low = 1.5\n", "eps_low < 1"),
        ('bound_action = "drop"\n', "bound_action"),
        ("bound = [\n", "TOML"),
    ],
)
def test_bad_parameters_are_usage_errors(logs, tmp_path, text, message):
    params = tmp_path / "loss.toml"
    params.write_text(text)
    result = replay(str(logs), "--db", str(tmp_path / "m.duckdb"), "--params", str(params))
    assert result.exit_code == EXIT_USAGE and message in result.output
    assert not (tmp_path / "m.duckdb").exists()


def assert_decisions_equal_numpy(db: Path, values: pd.DataFrame) -> None:
    """decision_summary and every method's mean grad_weight in run_summary equal DOMAIN.md 3b computed in
    numpy (`values`, tests/reference.py)."""
    expected = decision_figures(values, ["run_id"]).sort_index()
    weights = values[values["metric"] == "grad_weight"].groupby(["run_id", "method"])["value"].mean()
    with duckdb.connect(str(db), read_only=True) as con:
        got = con.sql("SELECT * FROM decision_summary").df().set_index(["run_id", "method"]).sort_index()
        sql = "SELECT run_id, method, mean FROM run_summary WHERE metric = 'grad_weight'"
        stored = con.sql(sql).df().set_index(["run_id", "method"])["mean"].sort_index()
    assert list(got.index) == list(expected.index)
    np.testing.assert_array_equal(got["n"], expected["n"])
    np.testing.assert_allclose(got["gradient_mass_error"], expected["gradient_mass_error"], rtol=1e-9)
    for flag in BINARY:
        np.testing.assert_allclose(got[f"{flag}_rate"], expected[f"{flag}_rate"], rtol=1e-12, atol=1e-15)
    assert list(stored.index) == list(weights.sort_index().index)
    np.testing.assert_allclose(stored, weights.sort_index(), rtol=1e-9)


@pytest.mark.parametrize("action", ["mask", "clamp"])
def test_bound_action_end_to_end_equals_numpy(logs, tmp_path, action):
    """U = 1.05, which this fast policy's behaviour weights pass often: masking drops those tokens from the
    gradient, clamping keeps them at weight U; the store holds exactly what DOMAIN.md 3b gives."""
    db = tmp_path / "m.duckdb"
    result = replay(str(logs), "--db", str(db), "--bound", "1.05", "--bound-action", action)
    assert result.exit_code == EXIT_OK, result.output
    values = reference_values(sorted(logs.glob("*.parquet")), bound=1.05, bound_action=action)
    truth = values[values["method"] == "ground_truth"].groupby("metric")["value"].mean()
    assert 0.05 < truth["bound_active"] < 0.95  # the bound decides on this log, both ways
    assert_decisions_equal_numpy(db, values)


def test_rows_without_advantage_are_judged_as_without_advantage(logs, tmp_path):
    """A log whose advantage is null on a quarter of its sequences: those rows get |A| = 1 and a two-sided
    clip, the others their own advantage's one-sided clip (DOMAIN.md 3b), end to end, with eps_high 0.28
    so that the two clips differ."""
    table = pq.read_table(logs / "p.parquet")
    missing = table["seq_id"].to_numpy() % 4 == 0
    advantage = pa.array(table["advantage"].to_numpy(), pa.float32(), mask=missing)
    table = table.set_column(table.schema.get_field_index("advantage"), "advantage", advantage)
    log = write_log_atomic(table, tmp_path / "logs" / "partial.parquet")
    db = tmp_path / "m.duckdb"
    result = replay(str(log), "--db", str(db), "--eps-high", "0.28")
    assert result.exit_code == EXIT_OK, result.output
    values = reference_values([log], eps_high=0.28)
    assert 0.2 < missing.mean() < 0.3
    assert_decisions_equal_numpy(db, values)
