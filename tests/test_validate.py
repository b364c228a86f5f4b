"""The validator's rules (DOMAIN.md sections 4-6): every rule on a file that breaks it and on files that
do not, the file discovery, the reports and the `proxaudit validate` command."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner

from evaluator.cli import cli
from evaluator.cli.common import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from evaluator.errors import NothingReadableError, UsageError
from evaluator.logio import write_log_atomic
from evaluator.trainer.synthetic import synthetic_steps
from evaluator.validate import find_parquet_files, require_readable, validate_file, validate_paths
from evaluator.validate.report import render_table, report_dict
from tests.builders import BUILDERS, FIRST_STEP, N_STEPS, SPEC, build, clean_table, set_column, where


@pytest.fixture(scope="module")
def table() -> pa.Table:
    return clean_table()


@pytest.fixture
def clean_file(tmp_path: Path, table: pa.Table) -> Path:
    return write_log_atomic(table, tmp_path / "clean.parquet")


class TestEveryRule:
    @pytest.mark.parametrize("case", sorted(BUILDERS))
    def test_broken_file_is_reported_with_its_row_count(self, case: str, tmp_path: Path, table: pa.Table):
        broken = build(case, tmp_path, table)
        report = validate_file(broken.path)
        hits = [p for p in report.problems if p.rule == broken.rule]
        assert hits, f"{case}: expected {broken.rule}, got {report.problems}"
        assert (hits[0].column, hits[0].rows) == (broken.column, broken.rows)
        assert hits[0].message
        assert {p.rule for p in report.problems} - {broken.rule} <= broken.also
        assert not report.ok

    def test_clean_file_breaks_no_rule(self, clean_file: Path, table: pa.Table):
        report = validate_file(clean_file)
        assert report.problems == []
        assert report.ok and report.readable and report.n_rows == table.num_rows

    @pytest.mark.parametrize(
        "spec",
        [
            dataclasses.replace(SPEC, prox_every=2),  # prox_logp null on odd steps: optional, allowed
            dataclasses.replace(SPEC, prox_every=0, with_proximal_t=False),  # no recompute, no proximal_t
            dataclasses.replace(SPEC, resume_fraction=0.0, n_minibatches=1),  # one segment, one minibatch
        ],
        ids=["prox-every-2", "no-prox-no-proximal-t", "single-segment"],
    )
    def test_other_correct_logs_are_clean(self, spec, tmp_path: Path):
        path = write_log_atomic(synthetic_steps(spec, FIRST_STEP, N_STEPS), tmp_path / "log.parquet")
        assert validate_file(path).problems == []

    def test_unknown_extra_columns_and_optional_columns_missing_are_allowed(self, tmp_path, table):
        slim = table.drop_columns(
            ["token_id", "advantage", "reward", "proximal_t_logp", "proximal_t_version"]
        )
        slim = slim.append_column("my_note", pa.array(["x"] * slim.num_rows))
        assert validate_file(write_log_atomic(slim, tmp_path / "slim.parquet")).problems == []

    def test_a_string_column_is_a_wrong_type_and_its_rules_are_skipped(self, tmp_path, table):
        index = table.schema.get_field_index("step")
        bad = table.set_column(index, pa.field("step", pa.string()), table["step"].cast(pa.string()))
        report = validate_file(write_log_atomic(bad, tmp_path / "bad.parquet"))
        assert [(p.rule, p.column) for p in report.problems] == [("wrong_type", "step")]
        assert "string" in report.problems[0].message and "int64" in report.problems[0].message

    def test_positive_and_non_finite_are_counted_apart(self, tmp_path, table):
        values = table["behave_logp"].to_numpy().copy()
        values[:3], values[3:5] = 0.5, np.inf  # +inf is non-finite, not "positive"
        report = validate_file(
            write_log_atomic(set_column(table, "behave_logp", values), tmp_path / "x.parquet")
        )
        assert {(p.rule, p.rows) for p in report.problems} == {("positive_logp", 3), ("non_finite_logp", 2)}
        assert "worst found 0.5" in next(p.message for p in report.problems if p.rule == "positive_logp")

    def test_proximal_t_logp_without_its_version_column(self, tmp_path, table):
        report = validate_file(
            write_log_atomic(table.drop_columns(["proximal_t_version"]), tmp_path / "x.parquet")
        )
        (problem,) = report.problems
        assert (problem.rule, problem.column, problem.rows) == (
            "proximal_t_pair",
            "proximal_t_version",
            table.num_rows,
        )

    def test_null_keys_are_one_problem_not_a_giant_sequence(self, tmp_path, table):
        log = where(table, "seq_id", np.ones(table.num_rows, dtype=bool), None)
        report = validate_file(write_log_atomic(log, tmp_path / "x.parquet"))
        assert [(p.rule, p.rows) for p in report.problems] == [("null_required", table.num_rows)]

    def test_glob_characters_in_the_file_name(self, tmp_path, table):
        broken = build("positive_logp", tmp_path, table)
        odd = broken.path.rename(tmp_path / "run[1]*.parquet")
        assert [(p.rule, p.rows) for p in validate_file(odd).problems] == [("positive_logp", broken.rows)]

    def test_empty_file_is_clean_with_a_note(self, tmp_path, table):
        report = validate_file(write_log_atomic(table.slice(0, 0), tmp_path / "empty.parquet"))
        assert report.ok and report.n_rows == 0 and report.notes

    def test_unreadable_file_says_why(self, tmp_path, table):
        report = validate_file(build("truncated", tmp_path, table).path)
        assert not report.readable and report.n_rows is None
        assert "Parquet" in report.problems[0].message


class TestPaths:
    def test_folders_are_searched_recursively_once_each(self, tmp_path, table):
        a = write_log_atomic(table, tmp_path / "a.parquet")
        b = write_log_atomic(table, tmp_path / "sub" / "b.parquet")
        (tmp_path / "notes.txt").write_text("not a log")
        assert find_parquet_files([tmp_path, a]) == [a, b]

    def test_missing_path_is_a_usage_error(self, tmp_path):
        with pytest.raises(UsageError, match="nope"):
            find_parquet_files([tmp_path / "nope"])

    def test_folder_without_parquet_is_nothing_readable(self, tmp_path):
        with pytest.raises(NothingReadableError):
            validate_paths([tmp_path])

    def test_require_readable(self, tmp_path, table):
        broken = validate_paths([build("not_parquet", tmp_path, table).path]).reports
        with pytest.raises(NothingReadableError, match="not_parquet"):
            require_readable(broken)
        require_readable(
            validate_paths(
                [write_log_atomic(table, tmp_path / "ok.parquet"), *[r.path for r in broken]]
            ).reports
        )


class TestFound:
    """What validate and replay say first: the folders of the files found, with their runs; and why a
    path gave nothing, or a file is no token log, with where the format is described."""

    def test_each_folder_is_named_with_its_runs_before_any_file(self, tmp_path, table):
        write_log_atomic(table, tmp_path / "a.parquet")
        other = set_column(table, "run_id", pa.array(["toy-b"] * table.num_rows))
        write_log_atomic(other, tmp_path / "toy" / "b.parquet")
        for command in (["validate"], ["replay", "--db", str(tmp_path / "out" / "m")]):
            result = CliRunner().invoke(cli, [*command, str(tmp_path)])
            lines = result.output.splitlines()
            head = next(i for i, line in enumerate(lines) if line.startswith("found 2 files in 2 folders"))
            first_file = next(i for i, line in enumerate(lines) if "a.parquet" in line)
            assert head < first_file, result.output
            assert f"  {tmp_path}/: 1 file, run {SPEC.run_id}" in lines, result.output
            assert f"  {tmp_path / 'toy'}/: 1 file, run toy-b" in lines, result.output
            assert f"{tmp_path}/*.parquet" in lines[head]  # how to leave the subfolder out

    def test_runs_come_from_the_footer_or_the_column(self, tmp_path, table):
        """One run per row group: the footer's statistics say it; two runs in a row group: the column is
        read. Either way the runs are the column's distinct values."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        from evaluator.logio import file_runs

        half = table.num_rows // 2
        mixed = set_column(table, "run_id", pa.array(["r1"] * half + ["r0"] * (table.num_rows - half)))
        one = write_log_atomic(table, tmp_path / "one.parquet", row_group_size=half // 3)
        two = write_log_atomic(mixed, tmp_path / "two.parquet")
        assert pq.ParquetFile(one).metadata.num_row_groups > 3
        for path in (one, two):
            expected = sorted(pc.unique(pq.read_table(path)["run_id"]).to_pylist())
            assert list(file_runs(path, 10)) == expected
        assert file_runs(two, 1) in (("r0",), ("r1",))
        assert file_runs(build("not_parquet", tmp_path, table).path, 10) == ()

    def test_a_folder_without_parquet_names_what_it_holds_and_the_format(self, tmp_path):
        (tmp_path / "tokens.csv").write_text("run_id,step\nx,1\n")
        (tmp_path / "_curve.csv").write_text("step\n1\n")  # a leading underscore: kept out, as for readers
        result = CliRunner().invoke(cli, ["validate", str(tmp_path)])
        assert result.exit_code == EXIT_USAGE
        assert "no *.parquet files" in result.output and "1 other file: tokens.csv)" in result.output
        assert "docs/token-log.md" in result.output

    def test_a_csv_file_points_to_the_schema_and_a_cut_parquet_says_truncated(self, tmp_path, table):
        csv = tmp_path / "tokens.csv"
        csv.write_text("run_id,step\nx,1\n")
        (message,) = [p.message for p in validate_file(csv).problems]
        assert message.startswith("not a Parquet file (a CSV file)") and "docs/token-log.md" in message
        (message,) = [p.message for p in validate_file(build("truncated", tmp_path, table).path).problems]
        assert message.startswith("cannot open as Parquet (truncated or corrupt?)")

    def test_the_schema_version_error_carries_the_line_that_adds_it(self, tmp_path, table):
        """The line of pyarrow in the message, run as it is on the table, gives a file that validates."""
        import pyarrow.parquet as pq

        bare = write_log_atomic(table.replace_schema_metadata({}), tmp_path / "bare.parquet")
        (problem,) = validate_file(bare).problems
        assert problem.rule == "schema_version"
        fixed = _run_quoted_line(problem.message, pq.read_table(bare), tmp_path / "fixed.parquet")
        assert validate_file(fixed).problems == []

    @pytest.mark.parametrize("column, wide", [("behave_logp", pa.float64()), ("pos", pa.int64())])
    def test_a_wide_column_is_refused_with_the_line_that_casts_it(self, tmp_path, table, column, wide):
        wider = table.set_column(table.schema.get_field_index(column), column, table[column].cast(wide))
        path = write_log_atomic(wider.replace_schema_metadata(table.schema.metadata), tmp_path / "w.parquet")
        (problem,) = validate_file(path).problems
        assert (problem.rule, problem.column) == ("wrong_type", column)
        import pyarrow.parquet as pq

        fixed = _run_quoted_line(problem.message, pq.read_table(path), tmp_path / "fixed.parquet")
        assert validate_file(fixed).problems == []


def test_the_token_log_page_shows_how_to_write_one(tmp_path, table, monkeypatch, repo_root):
    """The code of docs/token-log.md's "Writing one yourself", run as it is on a CSV export of a log
    (64-bit numbers, as read back), writes a file that validates clean with the log's values."""
    import re

    import pyarrow.csv
    import pyarrow.parquet as pq

    page = (repo_root / "docs" / "token-log.md").read_text()
    code = re.search(r"## Writing one yourself.*?```python\n(.*?)```", page, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    pyarrow.csv.write_csv(table, tmp_path / "tokens.csv")
    exec(code, {})  # noqa: S102 (the documented code)
    written = tmp_path / "my-run-0000.parquet"
    assert validate_file(written).problems == []
    assert pq.read_table(written).equals(table)


def _run_quoted_line(message: str, table: pa.Table, out: Path) -> Path:
    """Run the first `code` of `message` with `table` bound (and pyarrow as pa), then write the table."""
    import re

    import pyarrow.parquet as pq

    scope = {"table": table, "pa": pa, "pq": pq}
    exec(re.search(r"`(table = .+?)`", message).group(1), scope)  # noqa: S102 (our own message)
    pq.write_table(scope["table"], out)
    return out


class TestReports:
    def test_json_has_every_file_problem_and_counts(self, tmp_path, table, clean_file):
        broken = build("positive_logp", tmp_path, table)
        data = report_dict(validate_paths([clean_file, broken.path]).reports)
        assert [f["ok"] for f in data["files"]] == [True, False]
        assert data["files"][1]["problems"][0] == {
            "rule": "positive_logp",
            "column": "theta_logp",
            "rows": broken.rows,
            "message": data["files"][1]["problems"][0]["message"],
        }
        assert data["summary"] == {"files": 2, "clean": 1, "with_problems": 1, "unreadable": 0, "warnings": 0}
        assert data["runs"] == []

    def test_table_has_one_block_per_file_and_a_count_line(self, tmp_path, table, clean_file):
        reports = validate_paths([clean_file, build("pos_gap", tmp_path, table).path]).reports
        text = render_table(reports)
        assert "clean.parquet" in text and "pos_gap.parquet" in text and "pos_gap  pos" in text
        assert text.splitlines()[-1] == "2 files: 1 clean, 1 with problems, 0 unreadable"
        assert "note:" not in text and "note: alignment" in render_table(reports, verbose=True)


class TestCommand:
    def run(self, *args: str):
        return CliRunner().invoke(cli, ["validate", *map(str, args)])

    def test_exit_0_when_clean(self, clean_file):
        result = self.run(clean_file)
        assert result.exit_code == EXIT_OK, result.output
        assert "1 clean" in result.output

    def test_exit_1_when_a_file_breaks_a_rule_and_json_lists_it(self, tmp_path, table, clean_file):
        broken = build("duplicate_row", tmp_path, table)
        result = self.run("--format", "json", tmp_path)
        assert result.exit_code == EXIT_FINDINGS
        files = {Path(f["path"]).name: f for f in json.loads(result.output)["files"]}
        assert (
            files["clean.parquet"]["ok"] and files[broken.path.name]["problems"][0]["rule"] == "duplicate_row"
        )

    def test_exit_2_for_a_missing_path(self, tmp_path):
        result = self.run(tmp_path / "missing")
        assert result.exit_code == EXIT_USAGE and "missing" in result.output

    def test_exit_2_when_nothing_is_readable_with_the_reason(self, tmp_path, table):
        result = self.run(build("truncated", tmp_path, table).path)
        assert result.exit_code == EXIT_USAGE
        assert "unreadable" in result.output and "could be read" in result.output

    def test_exit_2_for_a_folder_without_parquet(self, tmp_path):
        assert self.run(tmp_path).exit_code == EXIT_USAGE
