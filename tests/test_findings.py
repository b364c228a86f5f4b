"""The data-driven findings (evaluator/validate/findings.py): each fires on a log with its bug and names
the run, the column and what to check; none fires on clean logs (synthetic, the reference trainer's fixtures).
The bugs are edits of clean logs, as trainers and adapters make them."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from evaluator.cli import cli
from evaluator.gate.judge import run_gate
from evaluator.logio import write_log_atomic
from evaluator.problems import SEVERITY
from evaluator.replay.pipeline import replay
from evaluator.store import connect_store
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps
from evaluator.trainer.train import Args, train
from evaluator.validate import (
    block_sample,
    check_advantage,
    check_logp,
    check_mask,
    check_minibatch,
    check_proximal_t,
    check_repeats,
    check_values,
    check_versions,
    columns,
    findings,
    groups,
    repeats,
    segments,
    shapes,
    validate_paths,
    verdicts,
    zero_prox,
)
from tests.builders import clean_table, roll_within_sequences, sequence_index, set_column, where

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SPEC = SyntheticSpec(run_id="bug", tokens_per_step=1536, mean_length=24)


def found(table: pa.Table, folder: Path, max_staleness: int | None = None, files: int = 1):
    """The findings of a call on `table` written as `files` files (split by step)."""
    folder.mkdir(parents=True, exist_ok=True)
    steps = np.array_split(np.unique(table["step"].to_numpy()), files)
    for i, chosen in enumerate(steps):
        part = table.filter(pc.is_in(table["step"], pa.array(chosen)))
        write_log_atomic(part, folder / f"part{i}.parquet")
    return validate_paths([folder], max_staleness)


def rules(validation) -> dict[str, str]:
    return {f.rule: f.severity for f in validation.findings}


def _last_rows(table: pa.Table) -> np.ndarray:
    group, starts, lengths = sequence_index(table)
    last = np.zeros(table.num_rows, bool)
    last[starts + lengths - 1] = True
    return last


def _followed(table: pa.Table) -> np.ndarray:
    return table["proximal_t_version"].to_numpy() == table["behave_version"].to_numpy() + 1


def _fixture_run(name: str) -> pa.Table:
    """A bundled run: `recompute` (SmolLM2-135M, lr 1e-5) or `toy/toy-recompute` (tiny model, lr 3e-3)."""
    folder, run = (FIXTURES / name).parent, Path(name).name
    return pa.concat_tables(pq.read_table(p) for p in sorted(folder.glob(f"{run}-*.parquet")))


# --- quiet on clean logs --------------------------------------------------------------------------


def test_no_finding_on_a_clean_synthetic_log(tmp_path):
    assert found(clean_table(), tmp_path).findings == []


def test_no_finding_on_the_fixtures():
    validation = validate_paths([FIXTURES])
    assert validation.findings == [] and all(r.ok for r in validation.reports)


@pytest.mark.parametrize(
    "spec",
    [
        SyntheticSpec(run_id="short", mean_length=8, n_minibatches=1, max_staleness=1),
        SyntheticSpec(run_id="long", mean_length=200, tokens_per_step=16384, max_staleness=16, drift=0.02),
        SyntheticSpec(run_id="fast", drift=0.3, resume_fraction=0.8, engine_mismatch=0.0),
        SyntheticSpec(run_id="sparse_prox", prox_every=3, with_proximal_t=False),
    ],
    ids=lambda s: s.run_id,
)
def test_no_finding_on_clean_logs_of_other_shapes(tmp_path, spec):
    assert found(synthetic_steps(spec, 20, 6), tmp_path, files=3).findings == []


TRAINER_SHAPES = {
    "fast-1mb-fresh": dict(lr=1e-2, n_minibatches=1, max_staleness=0, digits=2),
    "slow-4mb-stale": dict(lr=3e-4, n_minibatches=4, max_staleness=8, digits=8, decode_ticks_per_step=1),
    "mid-2mb-fp32": dict(lr=3e-3, n_minibatches=2, max_staleness=4, digits=3, engine_dtype="float32"),
    "fast-8mb-stale": dict(lr=1e-2, n_minibatches=8, max_staleness=8, digits=5, decode_ticks_per_step=1),
}


@pytest.mark.parametrize("shape", sorted(TRAINER_SHAPES))
def test_no_finding_on_reference_trainer_runs(tmp_path, shape):
    """Learning rate, minibatches, staleness, response length, engine precision: none makes a finding."""
    out = tmp_path / "logs"
    shape_args = TRAINER_SHAPES[shape]
    train(Args(steps=20, out_dir=str(out), run_id=shape, steps_per_file=5, log_every=0, **shape_args))
    validation = validate_paths([out])
    assert validation.findings == [] and all(r.ok for r in validation.reports)


@pytest.mark.parametrize(
    "staleness, minibatches, length, proximal_t",
    [
        (0, 1, 8, True), (12, 4, 200, True), (12, 1, 24, False), (4, 2, 100, True), (8, 3, 48, False),
        (1, 4, 8, True), (6, 2, 200, False), (0, 4, 48, False), (10, 2, 8, True),
    ],
)  # fmt: skip
def test_no_finding_on_synthetic_logs_over_staleness_minibatches_and_lengths(
    tmp_path, staleness, minibatches, length, proximal_t
):
    spec = SyntheticSpec(
        run_id="grid", max_staleness=staleness, n_minibatches=minibatches, mean_length=length,
        tokens_per_step=max(2048, 24 * length), drift=0.3, seed=staleness + 10 * minibatches,
        with_proximal_t=proximal_t,
    )  # fmt: skip
    validation = found(synthetic_steps(spec, 12, 16), tmp_path, files=3)
    assert validation.findings == [] and all(r.ok for r in validation.reports)


def test_no_finding_on_a_fresh_train_demo(tmp_path):
    """`proxaudit train-demo` with a tiny budget, as a user would start."""
    result = CliRunner().invoke(
        cli, ["train-demo", "--steps", "24", "--out-dir", str(tmp_path), "--log-every", "0"]
    )
    assert result.exit_code == 0, result.output
    validation = validate_paths([tmp_path])
    assert validation.findings == [] and all(r.ok for r in validation.reports)
    assert {c.status for c in validation.checks} >= {"passed"}


def test_the_report_says_which_checks_could_not_decide_and_why(tmp_path):
    """One minibatch, no advantage, no reward, no masked token: the checks that need them say so, in the
    terminal and the JSON report, run by run."""
    spec = replace(SPEC, n_minibatches=1, loss_mask_drop=0.0)
    table = synthetic_steps(spec, 8, 6).drop_columns(["advantage", "reward"])
    write_log_atomic(table, tmp_path / "logs" / "a.parquet")
    validation = validate_paths([tmp_path / "logs"])
    why = {c.check: c.why for c in validation.checks if c.status == "undecided"}
    assert why["theta_moves"] == "one minibatch per step"
    assert why["advantage_reward"] == why["advantage_movement"] == "no advantage column"
    assert why["reward_over_response"] == "no reward column"
    assert why["loss_mask_fragmented"] == "no response mixes trained and masked tokens"
    assert {c.check for c in validation.checks} == {c.name for c in findings.CHECKS}
    result = CliRunner().invoke(cli, ["validate", str(tmp_path / "logs")])
    assert "checks that could not decide" in result.output and "one minibatch per step" in result.output
    result = CliRunner().invoke(cli, ["validate", "--format", "json", str(tmp_path / "logs")])
    (run,) = json.loads(result.output)["runs"]
    assert run["run_id"] == "bug" and run["findings"] == []
    assert {"check": "theta_moves", "status": "undecided", "why": "one minibatch per step"} in run["checks"]


def test_the_evidence_is_in_the_terminal_and_the_json_report(tmp_path):
    write_log_atomic(_last_token_masked(clean_table()), tmp_path / "logs" / "a.parquet")
    finding = validate_paths([tmp_path / "logs"]).findings[0]
    text = CliRunner().invoke(cli, ["validate", str(tmp_path / "logs")]).output
    example = finding.examples[0]
    assert f"{finding.figure:.4g} ({finding.threshold})" in text and f"check: {finding.advice}" in text
    assert (
        f"step {example['step']} seq_id {example['seq_id']} minibatch {example['minibatch']} pos "
        f"{example['pos']}" in text
    )
    data = json.loads(
        CliRunner().invoke(cli, ["validate", "--format", "json", str(tmp_path / "logs")]).output
    )
    (reported,) = data["runs"][0]["findings"]
    assert reported["figure"] == finding.figure and reported["check"] == finding.advice
    assert reported["examples"][0] == example and reported["threshold"] == finding.threshold


# --- each bug, its finding ------------------------------------------------------------------------


def _minibatches_reversed(t: pa.Table) -> pa.Table:
    """minibatch written as n - 1 - i: theta at 'minibatch 0' was taken after three updates."""
    return set_column(t, "minibatch", pc.subtract(pc.subtract(t["n_minibatches"], 1), t["minibatch"]))


def _minibatch_dropped(t: pa.Table) -> pa.Table:
    return t.filter(pc.invert(pc.and_(pc.equal(t["minibatch"], 1), pc.greater(t["step"], 10))))


def _behave_from(column: str):
    return lambda t: set_column(t, "behave_logp", pc.fill_null(t[column], t["behave_logp"]))


def _proximal_t_equals_behave(t: pa.Table) -> pa.Table:
    return set_column(t, "proximal_t_logp", t["behave_logp"])


def _proximal_t_rolled(t: pa.Table) -> pa.Table:
    """proximal_t written 3 positions late (a length or offset bug, seeds/000); the rows it lands on
    outside the resumed tokens keep behave_logp."""
    rolled = roll_within_sequences(t, "proximal_t_logp", 3)["proximal_t_logp"].to_numpy()
    return set_column(t, "proximal_t_logp", np.where(_followed(t), rolled, t["behave_logp"].to_numpy()))


def _last_token_masked(t: pa.Table) -> pa.Table:
    return where(t, "loss_mask", _last_rows(t), False)


def _versions_off_by_one(t: pa.Table) -> pa.Table:
    t = set_column(t, "behave_version", pc.subtract(t["behave_version"], 1))
    return set_column(t, "proximal_t_version", pc.subtract(t["proximal_t_version"], 1))


def _frozen_counter(t: pa.Table) -> pa.Table:
    """One response whose version counter stayed at 0 (proximal_t left out: it has no resume)."""
    t = t.drop_columns(["proximal_t_logp", "proximal_t_version"])
    return where(t, "behave_version", pc.equal(t["seq_id"], t["seq_id"][0]).to_numpy(), 0)


def _recompute_skipped(t: pa.Table) -> pa.Table:
    """prox and theta written as zeros (NeMo-RL's force_on_policy_ratio dump, imported)."""
    zeros = pc.multiply(t["behave_logp"], 0)
    return set_column(set_column(t, "prox_logp", zeros), "theta_logp", zeros)


def _spec(**change) -> SyntheticSpec:
    return replace(SPEC, **change)


@dataclass(frozen=True)
class Bug:
    column: str
    spec: SyntheticSpec = SPEC
    edit: Callable[[pa.Table], pa.Table] | None = None
    first_step: int = 8
    n_steps: int = 6
    max_staleness: int | None = None

    def table(self) -> pa.Table:
        table = synthetic_steps(self.spec, self.first_step, self.n_steps)
        return self.edit(table) if self.edit else table


BUGS = {
    "incomplete_step": Bug("minibatch", edit=_minibatch_dropped),
    "behave_is_prox": Bug("behave_logp", edit=_behave_from("prox_logp")),
    "behave_is_theta": Bug("behave_logp", edit=_behave_from("theta_logp")),
    "proximal_t_not_updated": Bug("proximal_t_logp", edit=_proximal_t_equals_behave),
    "proximal_t_misplaced": Bug("proximal_t_logp", edit=_proximal_t_rolled),
    "proximal_t_wrong_version": Bug("proximal_t_logp", _spec(proximal_t_bug="not_updated")),
    "proximal_t_wrong_version:overwritten": Bug(
        "proximal_t_logp", _spec(proximal_t_bug="overwritten", resume_fraction=1.0), n_steps=24
    ),
    "loss_mask_edge": Bug("loss_mask", edit=_last_token_masked),
    "version_count": Bug("behave_version", _spec(max_staleness=3), _versions_off_by_one, n_steps=12),
    "staleness_gap": Bug("behave_version", _spec(max_staleness=2), _frozen_counter, first_step=30),
    "staleness_beyond_max": Bug("behave_version", max_staleness=4),
    "engine_mismatch": Bug("behave_logp", _spec(engine_mismatch=0.6)),
    "prox_logp_zero": Bug("prox_logp", edit=_recompute_skipped),
}


@pytest.mark.parametrize("rule", sorted(BUGS))
def test_each_bug_is_found(tmp_path, rule):
    bug = BUGS[rule]
    rule = rule.split(":")[0]
    validation = found(bug.table(), tmp_path, bug.max_staleness, files=2)
    print(rules(validation))
    (finding,) = [f for f in validation.findings if f.rule == rule]
    assert (finding.run_id, finding.column, finding.severity) == ("bug", bug.column, SEVERITY[rule])
    assert finding.rows > 0 and finding.figure is not None and finding.threshold and finding.advice
    assert 1 <= len(finding.examples) <= 3 and f"Check {finding.advice}" in finding.text


# --- bugs in the reference trainer's logs ----------------------------------------------------------


def _roll_loss_mask(t: pa.Table) -> pa.Table:
    """The loss mask rolled by one inside each response (its first token takes the last's value)."""
    rolled = roll_within_sequences(t, "loss_mask", -1)
    return where(rolled, "loss_mask", _last_rows(t), False)


FIXTURE_BUGS = {
    "theta_not_prox_at_minibatch_0": (_minibatches_reversed, "theta_logp"),
    "behave_is_prox": (_behave_from("prox_logp"), "behave_logp"),
    "proximal_t_not_updated": (_proximal_t_equals_behave, "proximal_t_logp"),
    "loss_mask_edge": (_roll_loss_mask, "loss_mask"),
}


@pytest.mark.parametrize(
    "rule, run",
    [
        (rule, run)
        for rule in sorted(FIXTURE_BUGS)
        for run in ("recompute", "toy/toy-recompute")
        if not (rule.startswith("theta") and run == "recompute")
    ],  # fmt: skip
)
def test_bugs_in_the_reference_trainers_logs_are_found(tmp_path, rule, run):
    """On SmolLM2's logs and the tiny model's; theta mislabelled only on the tiny model's: at lr 1e-5
    theta moves less within a step than bf16 noise (THETA_NOISE), so no check can see it."""
    edit, column = FIXTURE_BUGS[rule]
    validation = found(edit(_fixture_run(run)), tmp_path, files=4)
    assert {(f.rule, f.column) for f in validation.findings} == {(rule, column)}
    if SEVERITY[rule] == "error":
        assert not any(r.ok for r in validation.reports)  # every file of the run
    else:
        assert all(r.ok for r in validation.reports)


def test_pooling_finds_what_one_file_cannot(tmp_path):
    """A bug on few tokens per file: each file alone is under MIN_TOKENS, the call over all is not."""
    table = _proximal_t_equals_behave(clean_table())
    steps = np.unique(table["step"].to_numpy())
    alone = found(table.filter(pc.equal(table["step"], int(steps[0]))), tmp_path / "one")
    assert alone.findings == []
    assert rules(found(table, tmp_path / "all", files=len(steps))) == {"proximal_t_not_updated": "error"}


def test_every_finding_is_documented(repo_root):
    text = (repo_root / "docs" / "validate.md").read_text()
    readme = (repo_root / "README.md").read_text()
    for rule, severity in SEVERITY.items():
        assert f"| `{rule}` | {severity} |" in text, rule
        assert f"`{rule}`" in readme, rule
    assert {r for c in findings.CHECKS for r in c.rules} == set(SEVERITY)
    for check in findings.CHECKS:
        assert f"`{check.name}`" in text, check.name


THRESHOLD_MODULES = (
    verdicts, check_minibatch, check_logp, check_versions, check_proximal_t, check_mask, check_advantage,
    check_values, check_repeats, columns, repeats, groups, segments, shapes, block_sample, zero_prox,
)  # fmt: skip


@pytest.mark.parametrize("module", THRESHOLD_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_every_threshold_is_documented_with_its_reason(repo_root, module):
    """Each threshold is a named constant with a docstring (its reason), and its value is in the docs."""
    import ast
    import inspect

    text = (repo_root / "docs" / "validate.md").read_text()
    tree = ast.parse(inspect.getsource(module))
    body = tree.body
    names = [
        (node.targets[0], body[i + 1] if i + 1 < len(body) else None)
        for i, node in enumerate(body)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant | ast.UnaryOp | ast.Tuple)
    ]
    assert names, module.__name__
    for target, after in names:
        for name in [e.id for e in target.elts] if isinstance(target, ast.Tuple) else [target.id]:
            if not name.isupper() or name.startswith("_") or name in ("SIZES",):
                continue
            documented = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
            assert documented, f"{module.__name__}.{name} has no docstring (its reason)"
            value = getattr(module, name)
            forms = {
                f"{value:g}",
                f"{value:,}",
                f"{value:.0%}",
                f"{value:.2%}".replace(".00", ""),
                f"{value:,.0f}",
            }
            row = next(
                (line for line in text.splitlines() if f"`{name}`" in line and line.startswith("|")), ""
            )
            assert any(form in row for form in forms), (
                f"{module.__name__}.{name} = {value}: no row in the docs"
            )


# --- what the call does with them -----------------------------------------------------------------


def test_validate_exits_0_on_warnings_and_1_on_errors(tmp_path):
    write_log_atomic(_last_token_masked(clean_table()), tmp_path / "warn" / "a.parquet")
    result = CliRunner().invoke(cli, ["validate", str(tmp_path / "warn")])
    assert result.exit_code == 0, result.output
    assert "loss_mask_edge" in result.output and "warning" in result.output
    result = CliRunner().invoke(cli, ["validate", str(tmp_path / "warn"), "--max-staleness", "4"])
    assert result.exit_code == 1 and "staleness_beyond_max" in result.output


def test_replay_stores_warnings_and_the_gate_reads_them(tmp_path):
    write_log_atomic(_last_token_masked(clean_table()), tmp_path / "logs" / "a.parquet")
    db = tmp_path / "m"
    report = replay([tmp_path / "logs"], db, progress=False)
    assert [f.rule for f in report.findings] == ["loss_mask_edge"] and report.clean
    finding = report.findings[0]
    with connect_store(db) as con:
        stored = con.execute("SELECT run_id, rule, column_name, n_rows FROM run_findings").fetchall()
        evidence = con.execute(
            "SELECT figure, threshold, examples, advice, message FROM run_finding"
        ).fetchall()
        checks = dict(
            con.execute("SELECT check_name, status FROM run_check WHERE run_id = 'builder'").fetchall()
        )
    assert stored == [("builder", "loss_mask_edge", "loss_mask", finding.rows)]
    ((figure, threshold, examples, advice, message),) = evidence
    assert (figure, threshold, advice) == (finding.figure, finding.threshold, finding.advice)
    assert examples.startswith(f"step {finding.examples[0]['step']} seq_id {finding.examples[0]['seq_id']}")
    assert message == finding.text
    assert checks == {
        c.name: ("found" if c.name == "loss_mask_edges" else checks[c.name]) for c in findings.CHECKS
    }
    assert checks["theta_at_minibatch_0"] == "passed" and "undecided" in checks.values()
    (tmp_path / "t.toml").write_text('[[check]]\nfigure = "warnings"\nmax = 0\nmin_tokens = 0\n')
    gate = run_gate(db, tmp_path / "t.toml")
    assert [(v.verdict, v.value) for v in gate.verdicts] == [("fail", 1.0)]


def test_replay_skips_the_files_of_an_error(tmp_path):
    """Tokens beyond --max-staleness: an error of the files that hold them; the others are ingested."""
    logs = tmp_path / "logs"
    write_log_atomic(clean_table(), logs / "a.parquet")  # staleness up to 8
    fresher = replace(SPEC, run_id="builder", max_staleness=7)
    write_log_atomic(synthetic_steps(fresher, 14, 3), logs / "b.parquet")
    report = replay([logs], tmp_path / "m", progress=False, max_staleness=7)
    held = {Path(o.path).name: o.status for o in report.outcomes}
    assert held == {"a.parquet": "skipped", "b.parquet": "ingested"}
    assert "staleness_beyond_max" in report.outcomes[0].line()
