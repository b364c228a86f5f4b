"""The loss the decision metrics are computed under: given to `replay` as a preset, a TOML file, the
trainer's own config (`--loss-from`) or the shorthand flags, recorded in the store, never mixed in one
store; and its figures end to end against numpy and autograd over the token log."""

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
from evaluator.cli.common import EXIT_OK, EXIT_USAGE
from evaluator.formulas.loss import Loss, Rule
from evaluator.logio import write_log_atomic
from evaluator.store import connect_store
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps
from tests.reference import BINARY, decision_figures, estimates, loss_tokens, reference_values
from tests.test_gradients import correction


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("params")
    spec = SyntheticSpec(run_id="p", tokens_per_step=2048, mean_length=24, drift=0.4)  # a fast policy
    write_log_atomic(synthetic_steps(spec, 8, 3), folder / "p.parquet")
    return folder


def replay(*args: str):
    return CliRunner().invoke(cli, ["replay", *args])


def stored(db: Path) -> Loss:
    with connect_store(db) as con:
        row = con.execute("SELECT value FROM store_meta WHERE key = 'loss'").fetchone()
    return Loss.from_dict(json.loads(row[0]))


def grad_mass(db: Path) -> float:
    with connect_store(db) as con:
        sql = "SELECT mean FROM run_summary WHERE method = 'ground_truth' AND metric = 'grad_weight'"
        return con.execute(sql).fetchone()[0]


def test_defaults_are_recorded(logs, tmp_path):
    db = tmp_path / "m"
    assert replay(str(logs), "--db", str(db)).exit_code == EXIT_OK
    loss = stored(db)
    assert loss == Loss() and (loss.eps_low, loss.eps_high, loss.behave_weight) == (0.2, 0.2, "token")
    assert loss.rules == (Rule("token", "ratio", upper=5.0, action="mask"),)


def test_a_store_of_other_parameters_is_refused(logs, tmp_path):
    db = tmp_path / "m"
    assert replay(str(logs), "--db", str(db), "--bound", "3").exit_code == EXIT_OK
    before = stored(db), grad_mass(db)
    result = replay(str(logs), "--db", str(db))  # the defaults, U = 5
    assert result.exit_code == EXIT_USAGE
    assert "keep <= 3" in result.output and "keep <= 5" in result.output
    assert (stored(db), grad_mass(db)) == before
    assert replay(str(logs), "--db", str(db), "--bound", "3").exit_code == EXIT_OK  # the same: fine


def test_toml_file_and_flags(logs, tmp_path):
    params = tmp_path / "loss.toml"
    params.write_text('eps_low = 0.1\neps_high = 0.28\nbound = 2.0\nbound_action = "clamp"\n')
    db = tmp_path / "m"
    result = replay(str(logs), "--db", str(db), "--params", str(params), "--bound", "4")
    assert result.exit_code == EXIT_OK, result.output
    assert stored(db) == Loss(eps_low=0.1, eps_high=0.28, rules=(Rule(upper=4.0, action="clamp"),))


@pytest.mark.parametrize(
    "text, message",
    [
        ("eps = 0.2\n", "eps: unknown key"),
        ("eps_low = 1.5\n", "eps_low: 1.5 must be in (0, 1)"),
        ('bound_action = "drop"\n', "bound_action: 'drop' must be one of mask, clamp"),
        ("bound = [\n", "TOML"),
        ('eps_high = "0.3"\n', "eps_high: '0.3' must be a number"),
        ("bound_action = 5\n", "bound_action: 5 must be one of"),
        ('[[rule]]\nstatistic = "kl_k2"\naction = "clamp"\nupper = 1\n', "rule 1.action: clamp truncates"),
        ('[[rule]]\nlevel = "row"\nupper = 1\n', "rule 1.level: 'row' must be one of"),
        ('preset = "areal-nope"\n', "preset: 'areal-nope' must be one of"),
    ],
)
def test_bad_parameters_are_usage_errors(logs, tmp_path, text, message):
    params = tmp_path / "loss.toml"
    params.write_text(text)
    result = replay(str(logs), "--db", str(tmp_path / "m"), "--params", str(params))
    assert result.exit_code == EXIT_USAGE and message in result.output, result.output
    assert str(params) in result.output  # the file is named
    assert "Traceback" not in result.output
    assert not (tmp_path / "m").exists()


def assert_decisions_equal_numpy(db: Path, values: pd.DataFrame) -> None:
    """decision_summary and every method's mean grad_weight in run_summary equal DOMAIN.md 3b computed in
    numpy (`values`, tests/reference.py)."""
    expected = decision_figures(values, ["run_id"]).sort_index()
    weights = values[values["metric"] == "grad_weight"].groupby(["run_id", "method"])["value"].mean()
    with connect_store(db) as con:
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
    db = tmp_path / "m"
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
    db = tmp_path / "m"
    result = replay(str(log), "--db", str(db), "--eps-high", "0.28")
    assert result.exit_code == EXIT_OK, result.output
    values = reference_values([log], eps_high=0.28)
    assert 0.2 < missing.mean() < 0.3
    assert_decisions_equal_numpy(db, values)


AREAL_GSPO = """\
experiment_name: gsm8k-gspo-rs
actor:
  eps_clip: 0.2
  eps_clip_higher: 0.28
  importance_sampling_level: sequence
  use_decoupled_loss: true
  prox_logp_method: loglinear
  rejection_sampling:
    level: sequence
    metric: ratio
    agg: mean
    lower: 0.9
    upper: 1.1
  optimizer:
    lr: 1.0e-6
rollout:
  max_head_offpolicyness: 4
"""


def autograd_weights(df: pd.DataFrame, x: np.ndarray, loss: Loss) -> np.ndarray:
    """|d loss / d theta_logp| of every loss token through the plain torch loss of tests/test_gradients.py
    (the docs' GSPO with AReaL's sequence-level rejection), per sequence (run_id, seq_id, minibatch)."""
    import torch

    from tests.test_gradients import reference_loss

    code = codes(df)
    theta = torch.tensor(df["theta_logp"].to_numpy(np.float64), requires_grad=True)
    columns = (torch.tensor(v, dtype=torch.float64) for v in (x, df["behave_logp"], df["advantage"]))
    total = reference_loss(loss, theta, *columns, code)
    return np.abs(torch.autograd.grad(total, theta)[0].numpy())


def test_loss_from_an_areal_config_end_to_end(logs, tmp_path):
    """`--loss-from` AReaL's YAML with GSPO and sequence-level rejection: the keys read and ignored are
    named, the loss is recorded, and every estimator's gradient mass error and sequence clip flips equal
    autograd through the docs' loss on the token log."""
    config = tmp_path / "gsm8k_gspo.yaml"
    config.write_text(AREAL_GSPO)
    db = tmp_path / "m"
    result = replay(str(logs), "--db", str(db), "--loss-from", str(config))
    assert result.exit_code == EXIT_OK, result.output
    assert "importance_sampling_level = 'sequence'" in result.output and "actor.optimizer" in result.output
    assert "loglinear_shipped" in result.output  # the note: AReaL's loglinear is loglinear_shipped
    loss = stored(db)
    assert loss == Loss(
        eps_high=0.28,
        ratio_level="sequence",
        behave_weight="sequence_mean",
        rules=(Rule("sequence", "ratio", "mean", lower=0.9, upper=1.1),),
    )
    df = loss_tokens(sorted(logs.glob("*.parquet")))
    per_method = estimates(df)
    truth = autograd_weights(df, per_method["ground_truth"], loss)
    with connect_store(db) as con:
        got = con.sql("SELECT * FROM decision_summary").df().set_index("method")
    kept = correction(loss, *(torch_column(df, c) for c in ("prox_logp", "behave_logp")), codes(df))[1]
    assert 0.05 < 1 - kept.numpy().mean() < 0.95  # the rejection decides on this log
    for method in ("loglinear_shipped", "loglinear_exact", "rollout"):
        moved = np.abs(autograd_weights(df, per_method[method], loss) - truth).sum() / truth.sum()
        assert got.loc[method, "gradient_mass_error"] == pytest.approx(moved, rel=1e-9), method
    assert got["n_sequences"].iloc[0] == df.groupby(["seq_id", "minibatch"]).ngroups
    assert (got["sequence_bound_flip_rate"] > 0).any() and got["dual_clip_flip_rate"].isna().all()


def torch_column(df: pd.DataFrame, name: str):
    import torch

    return torch.tensor(df[name].to_numpy(np.float64))


def codes(df: pd.DataFrame) -> np.ndarray:
    return df.groupby(["run_id", "seq_id", "minibatch"], sort=False).ngroup().to_numpy()


def test_the_docs_list_every_preset():
    """docs/metrics.md's preset table names each preset once (brace groups expand as in a shell)."""
    import itertools
    import re
    from pathlib import Path

    from evaluator.lossconfig.presets import PRESETS

    text = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    table = text[text.index("<!-- presets -->") : text.index("<!-- /presets -->")]
    named = []
    for cell in (line.split("|")[1] for line in table.splitlines()[3:]):
        for pattern in re.findall(r"`([^`]+)`", cell):
            parts = [p.split(",") for p in re.split(r"\{([^}]*)\}", pattern)[1::2]]
            fixed = re.split(r"\{[^}]*\}", pattern)
            for choice in itertools.product(*parts):
                named.append("".join(a + b for a, b in itertools.zip_longest(fixed, choice, fillvalue="")))
    assert sorted(named) == sorted(PRESETS)


@pytest.mark.parametrize(
    "name", sorted(__import__("evaluator.lossconfig.presets", fromlist=["PRESETS"]).PRESETS)
)
def test_every_preset_decides_every_token(name):
    """Each preset's loss gives a finite, non-negative W on random tokens in sequences (one of one token),
    not all zero where the policies are close (the tightest presets keep sequences within 0.1%)."""
    from evaluator.formulas.gradients import decide, weight
    from evaluator.lossconfig.presets import PRESETS
    from tests.test_gradients import tokens

    x, b, t, advantage, seq = tokens(5, spread=0.0002)
    got = decide(x, t=t, b=b, advantage=advantage, abs_advantage=np.abs(advantage),
                 off_policy_weight=weight(t - b), seq=seq, loss=PRESETS[name])  # fmt: skip
    assert np.isfinite(got.grad_weight).all() and (got.grad_weight >= 0).all() and got.grad_weight.any()
