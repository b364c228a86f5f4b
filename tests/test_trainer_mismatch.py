"""Each trainer's own mismatch figure (issue 36 item 3): the view `trainer_mismatch` against each trainer's
definition computed in numpy over the fixture logs at staleness 0, its lines, the sentences,
`summary --by trainers`, the gate's reports and the dashboard's Overview and Drift pages."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from evaluator.cli import cli
from evaluator.store import open_store
from evaluator.store.trainers import trainer_report
from evaluator.verdict.report import TRAINERS_TITLE
from schemas.store import PUBLIC_VIEWS
from tests.conftest import FIXTURES
from tests.reference import loss_tokens


def expected_figures(df) -> dict[tuple[str, str], float]:
    """Each trainer's figure by its own definition (the sources in the view's `source` column), g the
    recompute, b behave_logp, on the tokens at staleness 0 (slime, Miles: the sequences all at staleness 0)
    of `df`, one run's tokens with prox_logp."""
    whole = df.assign(
        abs_diff=np.abs(df["prox_logp"] - df["behave_logp"]), diff=df["prox_logp"] - df["behave_logp"]
    )
    per_seq = whole.groupby(["seq_id", "minibatch"])
    fresh = per_seq["staleness"].max() == 0
    df = df[df["staleness"] == 0]
    g, b = df["prox_logp"].to_numpy(np.float64), df["behave_logp"].to_numpy(np.float64)
    k3 = np.mean(np.exp(g - b) - 1 - (g - b))
    seq_abs, seq_diff = per_seq["abs_diff"].mean()[fresh], per_seq["diff"].mean()[fresh]
    return {
        ("NeMo-RL", "token_mult_prob_error"): np.mean(np.exp(np.abs(g - b))),
        ("NeMo-RL", "gen_kl_error"): k3,
        ("prime-rl", "mismatch_kl"): k3,
        ("prime-rl", "kl_ent_ratio"): k3 / np.mean(-g),
        ("slime", "train_rollout_logprob_abs_diff"): seq_abs.mean(),
        ("Miles", "train_rollout_logprob_abs_diff"): seq_abs.mean(),
        ("Miles", "rollout/log_probs - rollout/rollout_log_probs"): abs(seq_diff.mean()),
        ("SkyRL", "rollout_train_logprobs_abs_diff_mean"): np.mean(np.abs(b - g)),
        ("OpenRLHF", "vllm_kl"): np.mean(b - g),
        ("AReaL", "logp_abs_diff"): np.mean(np.abs(b - g)),
        ("verl", "training/rollout_probs_diff_mean"): np.mean(np.abs(np.exp(g) - np.exp(b))),
    }


LINES = {
    ("NeMo-RL", "token_mult_prob_error"): 1.05,
    ("NeMo-RL", "gen_kl_error"): 1e-3,
    ("slime", "train_rollout_logprob_abs_diff"): 0.1,
    ("Miles", "rollout/log_probs - rollout/rollout_log_probs"): 0.03,
    ("verl", "training/rollout_probs_diff_mean"): 0.01,
    ("proxaudit", "floor_gradient_mass_error"): 0.01,
}


def test_each_trainer_figure_is_its_own_definition(fixture_store):
    files = [p for run in ("recompute", "loglinear") for p in sorted(FIXTURES.glob(f"{run}-*.parquet"))[:3]]
    df = loss_tokens(files)
    with open_store(fixture_store) as con:
        got = con.sql("SELECT * FROM trainer_mismatch").df()
        floor = con.sql("SELECT run_id, gradient_mass_error FROM engine_floor").df().set_index("run_id")
    assert list(got.columns) == list(PUBLIC_VIEWS["trainer_mismatch"])
    for run, tokens in df.groupby("run_id"):
        rows = got[got["run_id"] == run].set_index(["trainer", "metric"])
        judged = tokens[tokens["prox_logp"].notna()]
        for key, value in expected_figures(judged).items():
            assert rows.loc[key, "value"] == pytest.approx(value, rel=1e-9), (run, key)
            assert rows.loc[key, "n"] == (judged["staleness"] == 0).sum()
        # the same view's figure; two queries of a store's many data files may add in another order
        assert rows.loc[("proxaudit", "floor_gradient_mass_error"), "value"] == pytest.approx(
            floor.loc[run, "gradient_mass_error"], rel=1e-12
        )
        for key, row in rows.iterrows():
            if key not in LINES:
                assert np.isnan(row["line"]) and pd.isna(row["within_line"]), key
            else:
                assert row["line"] == LINES[key], key
                assert bool(row["within_line"]) == (row["value"] <= LINES[key]), key
            assert row["definition"] and row["source"]
        assert len(rows) == 12


def test_one_sentence_per_trainer(fixture_store):
    with open_store(fixture_store) as con:
        figures, sentences = trainer_report(con, "recompute")
    assert len(figures) == 12 and len(sentences) == 9  # 9 trainers, the floor's first
    assert sentences[0].startswith("recompute: proxaudit's engine floor")
    nemo = next(s for s in sentences if "NeMo-RL" in s)
    value = next(f.value for f in figures if f.metric == "token_mult_prob_error")
    assert f"token_mult_prob_error {value:.4g} (its line 1.05: within it)" in nemo
    slime = next(s for s in sentences if "slime" in s)
    assert "slime's --ci-test would pass at 0.1 (train_rollout_logprob_abs_diff" in slime


def test_summary_by_trainers(fixture_store):
    result = CliRunner().invoke(cli, ["summary", "--db", str(fixture_store), "--by", "trainers"])
    assert result.exit_code == 0, result.output
    assert (
        "token_mult_prob_error" in result.output and "your prime-rl would log kl_ent_ratio" in result.output
    )
    as_json = CliRunner().invoke(
        cli,
        ["summary", "--db", str(fixture_store), "--by", "trainers", "--format", "json", "--run", "loglinear"],
    )
    assert as_json.exit_code == 0 and '"source"' in as_json.output and "recompute" not in as_json.output


def test_dashboard_section(fixture_store, monkeypatch):
    """The Drift page ends with each trainer's sentence and the table (`dashboard/views/trainers.py`)."""
    from tests.test_dashboard_app import no_exception, run_app, texts

    at = run_app(fixture_store, monkeypatch, page="drift", run="recompute")
    no_exception(at)
    assert "Your trainer's own mismatch figure" in [s.value for s in at.subheader]
    assert "Each trainer logs the engine-vs-trainer mismatch" in texts(at)
    assert any("token_mult_prob_error" in t.value and "its line 1.05" in t.value for t in at.text)  # plain
    table = at.dataframe[-1].value
    assert len(table) == 12 and {"trainer", "metric", "value", "line", "source"} <= set(table.columns)


def judged_figures(fixture_store) -> dict[str, dict[tuple[str, str], float]]:
    """Each fixture run's trainer figures by their definitions, in numpy over its token log."""
    files = [p for run in ("recompute", "loglinear") for p in sorted(FIXTURES.glob(f"{run}-*.parquet"))[:3]]
    df = loss_tokens(files)
    return {
        run: expected_figures(tokens[tokens["prox_logp"].notna()]) for run, tokens in df.groupby("run_id")
    }


def test_the_gate_s_reports_hold_the_trainers_figures(fixture_store, tmp_path):
    """Terminal and Markdown: the table after the decisions (their floor verdicts included), before the
    checks; JSON: a `trainer_mismatch` list on each run's decision, its values those of each trainer's
    definition in numpy."""
    md, js = tmp_path / "gate.md", tmp_path / "gate.json"
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        cli, ["gate", "--db", str(fixture_store), "--markdown", str(md), "--json", str(js)]
    )
    assert result.exit_code in (0, 1), result.output
    expected = judged_figures(fixture_store)
    text = result.output
    title = text.index(TRAINERS_TITLE)
    checks = min(text.index(f"\n{v} ") for v in ("pass", "FAIL", "warn", "skip") if f"\n{v} " in text)
    assert text.rindex("Engine floor of run") < title < checks
    for run, figures in expected.items():
        for (trainer, metric), value in figures.items():
            row = [r for r in text.splitlines() if r.startswith(f"{run} ") and f" {trainer} " in r
                   and f" {metric} " in r]  # fmt: skip
            assert len(row) == 1 and f"{value:.4g}" in row[0].split(), (run, trainer, metric)
            line = LINES.get((trainer, metric))
            side = "-" if line is None else f"{line:g}  " + ("within" if value <= line else "beyond")
            assert side in row[0], row[0]
    markdown = md.read_text()
    decisions, table = markdown.rindex("\n- "), markdown.index(f"**{TRAINERS_TITLE[:-1]}**")
    assert decisions < table < markdown.index("| verdict |")
    nemo = expected["recompute"][("NeMo-RL", "token_mult_prob_error")]
    assert (
        f"| ` recompute ` | ` NeMo-RL ` | ` token_mult_prob_error ` | {nemo:.4g} | 1.05 | within |"
        in markdown
    )
    document = json.loads(js.read_text())
    for decision in document["decisions"]:
        rows = decision["trainer_mismatch"]
        assert len(rows) == 12 and rows[0]["trainer"] == "proxaudit"
        for row in rows[1:]:
            value = expected[decision["run_id"]][(row["trainer"], row["metric"])]
            assert row["value"] == pytest.approx(value, rel=1e-9), row
            line = LINES.get((row["trainer"], row["metric"]))
            assert row["line"] == line and row["within_line"] == (None if line is None else value <= line)
            assert row["definition"] and row["source"] and row["n"] > 0


def test_a_narrow_terminal_gets_one_sentence_per_trainer(fixture_store):
    from evaluator.verdict import judge_db
    from evaluator.verdict.report import render_table

    judgement = judge_db(fixture_store, run="recompute")
    text = render_table(judgement, width=80)
    assert max(map(len, text.splitlines())) <= 80
    assert "recompute: your NeMo-RL would log gen_kl_error" in text and "run        trainer" not in text
    assert TRAINERS_TITLE not in render_table(replace(judgement, trainers=()), width=200).replace("\n  ", " ")
    assert all(f.run_id == "recompute" for f in judgement.trainers) and len(judgement.trainers) == 12


def test_the_overview_says_what_each_trainer_would_log(fixture_store, monkeypatch):
    """Under the decision banner, as plain text (st.text: nothing from the store is parsed as Markdown),
    one line per trainer, the run's id left off, NeMo-RL's figure that of its definition in numpy."""
    from dashboard.views.overview import TRAINERS_INTRO
    from tests.test_dashboard_app import no_exception, run_app

    at = run_app(fixture_store, monkeypatch, page="overview", run="recompute")
    no_exception(at)
    (block,) = [t.value for t in at.text if t.value.startswith(TRAINERS_INTRO)]
    lines = block.splitlines()[1:]
    assert len(lines) == 9 and lines[0].startswith("- proxaudit's engine floor")
    nemo = judged_figures(fixture_store)["recompute"][("NeMo-RL", "token_mult_prob_error")]
    assert "- your NeMo-RL would log gen_kl_error" in block
    assert f"token_mult_prob_error {nemo:.4g} (its line 1.05: within it)" in block
    assert "slime's --ci-test would pass at 0.1" in block and "recompute:" not in block
    assert not any("would log" in m.value for m in at.markdown)
    kinds = [type(e).__name__ for e in at.main]
    assert kinds.index("Text") > min(kinds.index(k) for k in ("Success", "Warning", "Error") if k in kinds)
