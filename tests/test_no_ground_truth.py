"""A run logged without `prox_logp` (the usual production run): every stage says plainly that there is nothing
to judge the estimators against, instead of "clean", an empty table with exit 0, or a row of bare
"missing metric" failures. The token counts in the messages are computed here from the logs themselves."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from evaluator.cli import cli
from evaluator.cli.common import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from evaluator.logio import write_log_atomic
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps
from evaluator.validate import validate_paths

SAID = "nothing to judge the estimators against"
RUNS = {"blind": 0, "sampled": 3, "full": 1}  # run_id: prox_logp on every k-th step (0: never)


def loss_tokens(path: Path) -> int:
    return int(pc.sum(pq.read_table(path, columns=["loss_mask"])["loss_mask"]).as_py())


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("logs")
    for run_id, every in RUNS.items():
        spec = SyntheticSpec(run_id=run_id, tokens_per_step=768, mean_length=24, prox_every=every)
        write_log_atomic(synthetic_steps(spec, 8, 6), folder / f"{run_id}.parquet")
    return folder


@pytest.fixture(scope="module")
def store(logs, tmp_path_factory) -> tuple[Path, str]:
    """The logs replayed by the CLI: the store and replay's output."""
    db = tmp_path_factory.mktemp("store") / "m"
    result = CliRunner().invoke(cli, ["replay", str(logs), "--db", str(db)])
    assert result.exit_code == EXIT_OK, result.output
    return db, result.output


def test_validate_warns_per_run_with_no_prox_logp(logs):
    validation = validate_paths([logs])
    (finding,) = validation.findings  # the run with prox_logp on every 3rd step has ground truth
    n = loss_tokens(logs / "blind.parquet")
    assert (finding.rule, finding.run_id, finding.severity, finding.rows) == (
        "no_ground_truth",
        "blind",
        "warning",
        n,
    )
    assert (
        f"no token of run blind in these files has prox_logp (0 of {n:,} loss tokens): {SAID}"
        in finding.message
    )
    assert "prox_logp_method: metrics" in finding.text and "docs/hook.md" in finding.text
    result = CliRunner().invoke(cli, ["validate", str(logs)])
    assert result.exit_code == EXIT_OK  # a warning: the files are well-formed
    assert "run blind  0 errors, 1 warning" in result.output and SAID in result.output


def test_replay_warns_and_stores_the_warning_with_the_run(store):
    db, output = store
    lines = output.splitlines()
    at = next(i for i, line in enumerate(lines) if "no_ground_truth" in line)
    assert lines[at].split()[:3] == ["warning", "blind", "no_ground_truth"] and SAID in lines[at + 1]
    result = CliRunner().invoke(cli, ["query", "--db", str(db), "SELECT run_id, rule FROM run_findings"])
    assert result.output.split() == ["run_id", "rule", "blind", "no_ground_truth"]


def test_summary_says_so_instead_of_an_empty_table(store, logs):
    db, _ = store
    n = loss_tokens(logs / "blind.parquet")
    result = CliRunner().invoke(cli, ["summary", "--db", str(db), "--by", "decision", "--run", "blind"])
    assert result.exit_code == EXIT_USAGE
    assert result.output.startswith(f"proxaudit: error: no token of run blind has prox_logp (0 of {n:,}")
    assert SAID in result.output and "run_id" not in result.output  # no header of an empty table


def test_summary_of_every_run_shows_what_has_truth_and_names_what_has_not(store):
    db, _ = store
    table = CliRunner().invoke(cli, ["summary", "--db", str(db), "--by", "decision"])
    assert table.exit_code == EXIT_OK
    assert {line.split()[0] for line in table.output.splitlines()[1:] if line[:1].isalpha()} >= {
        "sampled",
        "full",
    }
    assert "no token of run blind has prox_logp" in table.stdout and SAID in table.stdout
    as_json = CliRunner().invoke(cli, ["summary", "--db", str(db), "--by", "decision", "--format", "json"])
    assert as_json.exit_code == EXIT_OK
    assert {row["run_id"] for row in json.loads(as_json.stdout)} == {"sampled", "full"}  # stdout stays JSON
    assert SAID in as_json.stderr
    weights = CliRunner().invoke(
        cli, ["summary", "--db", str(db), "--run", "blind", "--metric", "approx_logp"]
    )
    shown = {tuple(line.split()[:3]) for line in weights.stdout.splitlines()}
    assert weights.exit_code == EXIT_OK and ("blind", "rollout", "approx_logp") in shown  # needs no truth
    assert SAID in weights.stdout


def test_the_gates_failures_say_why(store, logs):
    db, _ = store
    n = loss_tokens(logs / "blind.parquet")
    result = CliRunner().invoke(cli, ["gate", "--db", str(db), "--json", str(db.parent / "gate.json")])
    assert result.exit_code == EXIT_FINDINGS
    verdicts = json.loads((db.parent / "gate.json").read_text())["verdicts"]
    blind = [v for v in verdicts if v["run_id"] == "blind" and v["figure"] != "warnings"]
    assert {v["outcome"] for v in blind} == {"missing_metric"}
    assert {v["verdict"] for v in blind if not v["warn_only"]} == {"fail"}  # never a pass
    expected = f"no token of run 'blind' has prox_logp (0 of {n:,} loss tokens): {SAID}"
    assert all(v["reason"].startswith(expected) for v in blind)
    assert not any(SAID in v["reason"] for v in verdicts if v["run_id"] != "blind")
    assert expected in result.output
    # the decision in words, first: it cannot tell, and says why (the gate's own words)
    (line,) = [
        line for line in result.output.splitlines() if line.startswith("- ") and " on run blind" in line
    ]
    assert line.startswith(
        "- Cannot tell yet whether to ship loglinear_shipped (AReaL actor.prox_logp_method: "
    )
    assert expected in line and "Engine floor of run blind: not measured" in line
    (decision,) = [
        d for d in json.loads((db.parent / "gate.json").read_text())["decisions"] if d["run_id"] == "blind"
    ]
    assert (decision["action"], decision["reason"]["outcome"]) == ("undecided", "missing_metric")
