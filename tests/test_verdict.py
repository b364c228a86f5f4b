"""The verdict a person acts on, end to end on replayed logs: the engine floor against numpy over the token
log, each figure's excess over it (paired: the floor's own excess is exactly 0), intervals that hold their
point, the safe staleness with 95% confidence by its definition on the views' bounds, and the same
sentence from `summary` and the gate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from evaluator.cli import cli
from evaluator.logio import write_log_atomic
from evaluator.replay import replay
from evaluator.store import connect_store
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps
from tests.reference import decision_figures, reference_values, safe_staleness


@pytest.fixture(scope="module")
def replayed(tmp_path_factory) -> tuple[Path, list[Path]]:
    folder = tmp_path_factory.mktemp("verdict")
    spec = SyntheticSpec(run_id="v", tokens_per_step=1024, mean_length=24, drift=0.3, engine_mismatch=0.05)
    files = [write_log_atomic(synthetic_steps(spec, 0, 30), folder / "v.parquet")]
    replay(files, folder / "m", progress=False)
    return folder / "m", files


def frame(db: Path, sql: str) -> pd.DataFrame:
    with connect_store(db) as con:
        return con.execute(sql).df()


def test_the_engine_floor_is_rollout_at_staleness_0(replayed):
    db, files = replayed
    values = reference_values(files)
    at_zero = values[values["staleness"] == 0]
    expected = decision_figures(at_zero, ["run_id"]).xs("rollout", level="method").iloc[0]
    floor = frame(db, "SELECT * FROM engine_floor").iloc[0]
    assert floor["n"] == expected["n"] and floor["gradient_mass_error"] > 0
    assert floor["gradient_mass_error"] == pytest.approx(expected["gradient_mass_error"], rel=1e-9)
    assert floor["clip_flip_rate"] == pytest.approx(expected["clip_flip_rate"], rel=1e-12)
    drift = at_zero[(at_zero["method"] == "ground_truth") & (at_zero["metric"] == "prob_drift")]["value"]
    assert floor["prob_drift"] == pytest.approx(drift.mean(), rel=1e-9)
    for name in ("gradient_mass_error", "clip_flip_rate", "prob_drift", "exp_abs_drift"):
        assert floor[f"{name}_lower"] <= floor[name] <= floor[f"{name}_upper"], name
        assert floor[f"{name}_lower"] < floor[f"{name}_upper"], name


def test_excess_is_the_figure_minus_the_floor_on_the_same_draws(replayed):
    db, _ = replayed
    floor = frame(db, "SELECT * FROM engine_floor").iloc[0]
    rows = frame(db, "SELECT * FROM decision_staleness_summary").set_index(["staleness", "method"])
    for (_, method), row in rows.iterrows():
        for name in ("gradient_mass_error", "clip_flip_rate"):
            assert row[f"excess_{name}"] == pytest.approx(row[name] - floor[name], rel=1e-12, abs=1e-15)
            assert row[f"{name}_lower"] <= row[name] <= row[f"{name}_upper"], (method, name)
    rollout = rows.loc[(0, "rollout")]
    for name in ("gradient_mass_error", "clip_flip_rate"):  # paired: the floor minus itself, every draw
        assert rollout[f"excess_{name}"] == 0
        assert rollout[f"excess_{name}_lower"] == rollout[f"excess_{name}_upper"] == 0


def test_safe_staleness_with_confidence_follows_its_definition(replayed):
    """The macro's `_lower` (with 95% confidence) and `_upper` equal the definition applied to each
    staleness's interval bounds, absolute and beyond the floor."""
    db, _ = replayed
    levels = frame(db, "SELECT * FROM decision_staleness_summary")
    macro = frame(db, "SELECT * FROM safe_staleness()").set_index("method")
    for method, part in levels.groupby("method"):
        for column, prefix, bound in (
            ("safe_staleness_lower", "", "_upper"), ("safe_staleness_upper", "", "_lower"),
            ("safe_staleness_beyond_floor_lower", "excess_", "_upper"),
            ("safe_staleness_beyond_floor", "excess_", ""),
        ):  # fmt: skip
            judged = pd.DataFrame({
                "staleness": part["staleness"], "n": part["n"],
                "gradient_mass_error": part[f"{prefix}gradient_mass_error{bound}"],
                "clip_flip_rate": part[f"{prefix}clip_flip_rate{bound}"],
            })  # fmt: skip
            assert macro.loc[method, column] == safe_staleness(judged, 0.01, 0.01, 1000), (method, column)
    assert (macro["safe_staleness_lower"] <= macro["safe_staleness"]).all()
    assert (macro["safe_staleness"] <= macro["safe_staleness_upper"]).all()


def test_summary_json_carries_the_floor_the_excess_and_every_bound(replayed):
    db, _ = replayed
    result = CliRunner().invoke(cli, ["summary", "--db", str(db), "--by", "decision", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    keys = set(rows[0])
    for figure in ("gradient_mass_error", "clip_flip_rate", "bound_flip_rate"):
        assert {figure, f"{figure}_lower", f"{figure}_upper", f"excess_{figure}", f"excess_{figure}_lower",
                f"excess_{figure}_upper", f"floor_{figure}", f"floor_{figure}_lower"} <= keys  # fmt: skip
    assert {"safe_staleness", "safe_staleness_lower", "safe_staleness_upper", "safe_staleness_beyond_floor",
            "safe_staleness_beyond_floor_lower", "safe_staleness_beyond_floor_upper"} <= keys  # fmt: skip
    assert len({r["floor_gradient_mass_error"] for r in rows}) == 1  # the run's, on every method's row
    assert np.isfinite([r["gradient_mass_error_lower"] for r in rows]).all()


def test_summary_and_gate_say_the_same_decision(replayed, tmp_path):
    """One decision line per run, the same in `summary --by decision`, the gate's terminal report and its
    JSON `decisions`: what to do with the gated method, then the engine floor's own verdict."""
    db, _ = replayed
    table = CliRunner().invoke(cli, ["summary", "--db", str(db), "--by", "decision"]).output
    report = tmp_path / "gate.json"
    gate = CliRunner().invoke(cli, ["gate", "--db", str(db), "--json", str(report)]).output
    (decision,) = json.loads(report.read_text())["decisions"]
    assert decision["run_id"] == "v" and decision["method"] == "loglinear_shipped"
    for text in (table, gate):
        lines = [line for line in text.splitlines() if line.startswith("- ")]
        assert len(lines) == 1 and lines[0].startswith(f"- {decision['sentence']} Engine floor of run v: ")
        assert "of the gradient mass" in lines[0] and "Under the loss PPO" in text


def well_approximated(folder: Path) -> Path:
    """A log whose prox and theta are within 1e-4 nats of behave on every token (an engine that matches
    the trainer, a policy that barely moves): the approximation cannot change any decision."""
    spec = SyntheticSpec(run_id="tight", tokens_per_step=2048, mean_length=24, with_proximal_t=False)
    table = synthetic_steps(spec, 8, 12)
    rng = np.random.default_rng(7)
    behave = table["behave_logp"].to_numpy().astype(np.float64)
    for column in ("prox_logp", "theta_logp"):
        near = np.minimum(behave + rng.uniform(-1e-4, 1e-4, len(behave)), 0.0).astype(np.float32)
        assert np.abs(near - behave).max() <= 1e-4 + 1e-6
        table = table.set_column(table.schema.get_field_index(column), column, pa.array(near))
    return write_log_atomic(table, folder / "tight.parquet")


def test_a_well_approximated_log_ships(tmp_path):
    log = well_approximated(tmp_path)
    db = tmp_path / "m"
    assert replay([log], db, progress=False).clean
    report = tmp_path / "gate.json"
    result = CliRunner().invoke(cli, ["gate", "--db", str(db), "--json", str(report)])
    assert result.exit_code == 0, result.output
    (decision,) = json.loads(report.read_text())["decisions"]
    tokens = pq.read_table(log).to_pandas().query("loss_mask")
    per_level = (tokens["step"] - tokens["behave_version"]).value_counts()
    top = int(per_level[per_level >= 1000].index.max())  # S: the log's largest staleness with 1,000 tokens
    assert top >= 4 and (decision["action"], decision["max_staleness"], decision["judged_up_to"]) == (
        "ship", top, top
    )  # fmt: skip
    assert decision["sentence"].startswith(
        "Ship loglinear_shipped (AReaL actor.prox_logp_method: loglinear) on run tight with "
        f"max_head_offpolicyness up to {top}: every staleness 1-{top} passes"
    )
    assert decision["floor"]["outcome"] == "pass" and decision["gate_passed"]
    assert result.output.splitlines()[1].startswith("- Ship loglinear_shipped")
