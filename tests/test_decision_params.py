"""The loss's thresholds of the decision metrics (eps_low, eps_high, U, bound action): given to `replay`
by flags and/or a TOML file, recorded in the store, and never mixed in one store."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from evaluator.cli import cli
from evaluator.cli.common import EXIT_OK, EXIT_USAGE
from evaluator.logio import write_log_atomic
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps


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
        ('bound_action = "drop"\n', "bound_action must be 'mask' or 'clamp', got 'drop'"),
        ("bound = [\n", "TOML"),
        # a type error names the file and the key (it was "'>=' not supported between 'str' and 'int'")
        ('eps_high = "0.3"\n', "eps_high must be a number, got '0.3' (str)"),
        ("bound_action = 5\n", "bound_action must be 'mask' or 'clamp', got 5 (int)"),
        ("bound = true\n", "bound must be a number, got True (bool)"),
        ("eps_low = [0.1]\n", "eps_low must be a number, got [0.1] (list)"),
    ],
)
def test_bad_parameters_are_usage_errors(logs, tmp_path, text, message):
    params = tmp_path / "loss.toml"
    params.write_text(text)
    result = replay(str(logs), "--db", str(tmp_path / "m.duckdb"), "--params", str(params))
    assert result.exit_code == EXIT_USAGE and message in result.output
    assert f"--params {params}" in result.output
    assert not (tmp_path / "m.duckdb").exists()


def test_clamp_and_mask_differ_where_weights_pass_u(logs, tmp_path):
    """Masking drops the tokens above U from the gradient; clamping keeps them at weight U."""
    masked, clamped = tmp_path / "mask.duckdb", tmp_path / "clamp.duckdb"
    assert replay(str(logs), "--db", str(masked), "--bound", "1.05").exit_code == EXIT_OK
    assert (
        replay(str(logs), "--db", str(clamped), "--bound", "1.05", "--bound-action", "clamp").exit_code == 0
    )
    assert grad_mass(clamped) > grad_mass(masked)
