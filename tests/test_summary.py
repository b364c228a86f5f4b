"""`proxaudit summary`: filters, formats and errors."""

from __future__ import annotations

import csv
import io
import json

import pytest
from click.testing import CliRunner

from evaluator.cli import cli
from evaluator.errors import UsageError
from evaluator.formulas.loss import DEFAULT_LOSS
from evaluator.logio import write_log_atomic
from evaluator.replay.pipeline import replay
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps
from evaluator.verdict.summary import render, summary_table
from schemas.store import METHODS, metrics_for


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    folder = tmp_path_factory.mktemp("summary")
    spec = SyntheticSpec(run_id="r1", tokens_per_step=512, mean_length=16, max_staleness=3)
    write_log_atomic(synthetic_steps(spec, 0, 6), folder / "r1.parquet")
    replay([folder], folder / "m")
    return folder / "m"


SERIES = [(method, m.name) for method in METHODS for m in metrics_for(method, DEFAULT_LOSS)]


def test_filters_and_grain(db):
    table = summary_table(db, by="staleness", method="loglinear", metric="abs_error")
    rows = table.to_pylist()
    assert [r["staleness"] for r in rows] == [0, 1, 2, 3]
    assert {(r["method"], r["metric"]) for r in rows} == {("loglinear", "abs_error")}
    steps = summary_table(db, by="step", method="rollout", metric="approx_logp").column("step").to_pylist()
    assert steps == list(range(6))
    assert summary_table(db).num_rows == len(SERIES)  # every method x metric of the loss (the log has all)


def test_unknown_names_are_usage_errors(db):
    with pytest.raises(UsageError, match="unknown method"):
        summary_table(db, method="nope")
    with pytest.raises(UsageError, match="no run 'x'.*r1"):
        summary_table(db, run="x")


def test_formats(db):
    table = summary_table(db, method="linear", metric="importance_weight")
    (row,) = json.loads(render(table, "json"))
    assert row["run_id"] == "r1" and row["p50"] <= row["p90"] <= row["p99"] <= row["max"]
    (parsed,) = list(csv.DictReader(io.StringIO(render(table, "csv"))))
    assert float(parsed["mean"]) == pytest.approx(row["mean"])
    text = render(table, "table").splitlines()
    stats = ["n", "mean", "min", "max", "p50", "p90", "p99", "mean_lower", "mean_upper"]
    assert text[0].split() == ["run_id", "method", "metric", *stats]
    assert text[1].split()[:3] == ["r1", "linear", "importance_weight"]


def test_cli_missing_db_is_exit_2(tmp_path):
    result = CliRunner().invoke(cli, ["summary", "--db", str(tmp_path / "none")])
    assert result.exit_code == 2 and "no metrics store" in result.output


def test_cli_prints_json(db):
    result = CliRunner().invoke(cli, ["summary", "--db", str(db), "--by", "step", "--format", "json"])
    assert result.exit_code == 0
    assert len(json.loads(result.output)) == 6 * len(SERIES)


def test_every_command_has_help():
    for command in ("replay", "summary", "bench"):
        result = CliRunner().invoke(cli, [command, "--help"])
        assert result.exit_code == 0 and "Usage" in result.output


@pytest.mark.parametrize(
    "sql, found",
    [
        ("DROP VIEW decision_summary", "one DROP statement"),
        ("CREATE TABLE t AS SELECT 1", "one CREATE statement"),
        ("INSERT INTO store.main.store_meta VALUES (1, 2)", "one INSERT statement"),
        ("SET threads = 1", "one SET statement"),
        ("CHECKPOINT", "one CALL statement"),
        ("SELECT 1; DROP VIEW run_summary", "2 statements (SELECT, DROP)"),
        ("  ", "no statement"),
    ],
)
def test_query_refuses_what_does_not_only_read(db, sql, found):
    """A statement that would write (the reader's own views, or the store) is refused and says which kinds
    run, never printed as done ("Success" for a DROP it did not do)."""
    result = CliRunner().invoke(cli, ["query", "--db", str(db), sql])
    assert result.exit_code == 2, result.output
    assert f"this is {found}, not run" in result.output and "SELECT (also WITH" in result.output
    assert "Success" not in result.output and "Count" not in result.output


def test_query_runs_every_kind_of_read(db):
    n_series = len(SERIES)
    for sql in (
        "SELECT count(*) AS n FROM run_summary",
        "WITH s AS (SELECT * FROM run_summary) SELECT count(*) AS n FROM s",
        "FROM run_summary SELECT count(*) AS n",
    ):
        result = CliRunner().invoke(cli, ["query", "--db", str(db), sql, "--format", "json"])
        assert result.exit_code == 0 and json.loads(result.output) == [{"n": n_series}], (sql, result.output)
    for sql in ("DESCRIBE run_summary", "SHOW TABLES", "SUMMARIZE run_summary", "VALUES (1)"):
        assert CliRunner().invoke(cli, ["query", "--db", str(db), sql]).exit_code == 0, sql


def test_an_empty_store_says_so_and_exits_1(empty_store):
    """A store nothing was replayed into has no table to show: said, exit 1 (not an empty header, exit 0)."""
    for by in ("run", "decision"):
        result = CliRunner().invoke(cli, ["summary", "--db", str(empty_store), "--by", by])
        assert result.exit_code == 1, result.output
        assert result.output.strip() == (
            f"no run in {empty_store} yet: replay token logs into it first (proxaudit replay LOGS --db "
            f"{empty_store})"
        )


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("two")
    for run, seed in (("a", 1), ("b", 2)):
        spec = SyntheticSpec(run_id=run, seed=seed, tokens_per_step=2048, mean_length=16, max_staleness=3)
        write_log_atomic(synthetic_steps(spec, 3, 8), folder / f"{run}.parquet")
    replay([folder], folder / "m", progress=False)
    return folder / "m"


def test_decision_says_one_line_per_run_within_the_terminal(two_runs):
    """`--by decision` opens with the decision on each run, one line each (the sentence, then the engine
    floor's), every line of the output within COLUMNS; the table leaves out the columns that do not fit,
    and says which."""
    wide = CliRunner().invoke(
        cli, ["summary", "--db", str(two_runs), "--by", "decision"], env={"COLUMNS": ""}
    )
    assert wide.exit_code == 0, wide.output
    decided = [line for line in wide.output.splitlines() if line.startswith("- ")]
    assert [line.split(" on run ")[1].split(" ")[0].rstrip(":") for line in decided] == ["a", "b"]
    assert all("Engine floor of run" in line for line in decided)
    narrow = CliRunner().invoke(
        cli, ["summary", "--db", str(two_runs), "--by", "decision"], env={"COLUMNS": "80"}
    )
    assert narrow.exit_code == 0, narrow.output
    lines = narrow.output.splitlines()
    assert max(map(len, lines)) <= 80, [line for line in lines if len(line) > 80]
    assert sum(line.startswith("- ") for line in lines) == 2  # still one decision per run, wrapped
    assert " ".join(line.strip() for line in lines).count("Engine floor of run") == 2
    said = " ".join(line.strip() for line in lines)
    assert "(left out to fit 80 characters: " in said and "; --format json or csv has them)" in said
    header = lines[lines.index("") + 1 if "" in lines else 0]
    assert header.split()[:2] == ["run_id", "method"]
