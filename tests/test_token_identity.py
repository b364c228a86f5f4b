"""Each token counted once (DOMAIN.md section 6): a file that repeats a token `(run_id, seq_id, minibatch,
pos)` of another file is refused by `replay` (against the store, whichever replay stored it) and reported
by `validate` (across the files of one call), naming the file that holds the tokens first."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from evaluator.cli import cli
from evaluator.cli.common import EXIT_FINDINGS, EXIT_OK
from evaluator.logio import write_log_atomic
from evaluator.replay.pipeline import replay
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps
from evaluator.validate import validate_paths

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def resave(source: Path, target: Path, compression: str) -> Path:
    """The same table written again with another codec (other bytes, so another digest)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pq.read_table(source), target, compression=compression)
    assert target.read_bytes() != source.read_bytes()
    return target


def counts(db: Path) -> dict[str, int]:
    with duckdb.connect(str(db), read_only=True) as con:
        tables = ("ingested_file", "file_sequences", "file_tokens", "metric_moments", "sketch_by_step")
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}


def run_tokens(db: Path, run_id: str) -> int:
    with duckdb.connect(str(db), read_only=True) as con:
        sql = "SELECT n FROM run_summary WHERE run_id = ? AND method = 'rollout' AND metric = 'approx_logp'"
        return con.execute(sql, [run_id]).fetchone()[0]


@pytest.fixture
def fixture_copy(tmp_path) -> tuple[Path, Path]:
    """A real fixture file and the same log re-saved with snappy (the fixtures are zstd)."""
    source = sorted(FIXTURES.glob("recompute-*.parquet"))[0]
    (tmp_path / "logs").mkdir()
    original = Path(shutil.copy(source, tmp_path / "logs" / "a.parquet"))
    return original, resave(source, tmp_path / "logs" / "b.parquet", "snappy")


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "workers"])
def test_a_resaved_fixture_is_refused_and_the_run_counted_once(tmp_path, fixture_copy, workers):
    original, copy = fixture_copy
    alone = tmp_path / "alone.duckdb"
    replay([original], alone)
    db = tmp_path / "m.duckdb"
    report = replay([original.parent], db, workers=workers)
    assert [(o.path.name, o.status) for o in report.outcomes] == [
        ("a.parquet", "ingested"),
        ("b.parquet", "skipped"),
    ]
    (problem,) = report.outcomes[1].problems
    assert problem.rule == "duplicate_across_files" and str(original.resolve()) in problem.message
    assert "run_id recompute seq_id" in problem.message
    assert problem.rows == pq.read_metadata(copy).num_rows  # every token of the copy is a repeat
    assert counts(db) == counts(alone)  # nothing of the refused file is stored
    assert run_tokens(db, "recompute") == run_tokens(alone, "recompute")


def test_the_cli_exits_1_and_names_the_holder(tmp_path, fixture_copy):
    original, copy = fixture_copy
    result = CliRunner().invoke(cli, ["replay", str(original.parent), "--db", str(tmp_path / "m.duckdb")])
    assert result.exit_code == EXIT_FINDINGS, result.output
    line = next(line for line in result.output.splitlines() if line.startswith(str(copy)))
    assert "skipped: duplicate_across_files" in line and str(original.resolve()) in line


def test_a_later_replay_refuses_a_file_repeating_stored_tokens(tmp_path, fixture_copy):
    original, copy = fixture_copy
    db = tmp_path / "m.duckdb"
    assert replay([original], db).n_ingested == 1
    before = counts(db)
    (outcome,) = replay([copy], db).outcomes
    assert outcome.status == "skipped" and outcome.problems[0].rule == "duplicate_across_files"
    assert counts(db) == before


def two_ranks(folder: Path) -> tuple[Path, Path, int]:
    """Two ranks' files of one run whose sequences overlap: rank 1 wrote some of rank 0's again."""
    table = synthetic_steps(SyntheticSpec(run_id="ranks", tokens_per_step=1024, mean_length=24), 0, 4)
    seq = table["seq_id"].to_numpy()
    cut_lo, cut_hi = sorted(set(seq))[len(set(seq)) // 3], sorted(set(seq))[2 * len(set(seq)) // 3]
    rank0 = table.filter(pc.less(table["seq_id"], cut_hi))
    rank1 = table.filter(pc.greater_equal(table["seq_id"], cut_lo))
    shared = int(
        pc.sum(pc.and_(pc.greater_equal(table["seq_id"], cut_lo), pc.less(table["seq_id"], cut_hi))).as_py()
    )
    return (
        write_log_atomic(rank0, folder / "rank0.parquet"),
        write_log_atomic(rank1, folder / "rank1.parquet"),
        shared,
    )


def test_two_ranks_writing_the_same_sequences(tmp_path):
    rank0, rank1, shared = two_ranks(tmp_path / "logs")
    report = replay([tmp_path / "logs"], tmp_path / "m.duckdb")
    assert [o.status for o in report.outcomes] == ["ingested", "skipped"]
    (problem,) = report.outcomes[1].problems
    assert problem.rows == shared and str(rank0.resolve()) in problem.message


def test_validate_reports_the_same_cross_file_duplicates(tmp_path, fixture_copy):
    original, copy = fixture_copy
    a, b = validate_paths([original.parent]).reports
    assert a.ok and [p.rule for p in b.problems] == ["duplicate_across_files"]
    assert str(original) in b.problems[0].message
    result = CliRunner().invoke(cli, ["validate", str(original.parent)])
    assert result.exit_code == EXIT_FINDINGS and "duplicate_across_files" in result.output


def test_validate_two_ranks(tmp_path):
    rank0, rank1, shared = two_ranks(tmp_path / "logs")
    reports = validate_paths([tmp_path / "logs"]).reports
    assert reports[0].ok and reports[1].problems[0].rows == shared


def test_files_of_other_steps_runs_and_minibatches_are_not_duplicates(tmp_path):
    """The same seq_id in another run, or in another minibatch of the same run, is another token."""
    spec = SyntheticSpec(run_id="x", tokens_per_step=512, mean_length=16)
    first = synthetic_steps(spec, 0, 2)
    write_log_atomic(first, tmp_path / "logs" / "x-0.parquet")
    write_log_atomic(synthetic_steps(spec, 2, 2), tmp_path / "logs" / "x-2.parquet")
    other_run = first.set_column(0, "run_id", pa.array(["y"] * first.num_rows))
    write_log_atomic(other_run, tmp_path / "logs" / "y-0.parquet")
    shifted = pc.add(first["minibatch"], pa.scalar(first["n_minibatches"][0].as_py(), pa.int32()))
    other_minibatch = first.set_column(
        first.schema.get_field_index("minibatch"), "minibatch", shifted
    ).set_column(
        first.schema.get_field_index("n_minibatches"),
        "n_minibatches",
        pc.multiply(first["n_minibatches"], pa.scalar(2, pa.int32())),
    )
    write_log_atomic(other_minibatch, tmp_path / "logs" / "z-0.parquet")
    assert all(r.ok for r in validate_paths([tmp_path / "logs"]).reports)
    result = CliRunner().invoke(cli, ["replay", str(tmp_path / "logs"), "--db", str(tmp_path / "m.duckdb")])
    assert result.exit_code == EXIT_OK, result.output
