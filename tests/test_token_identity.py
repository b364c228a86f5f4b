"""Each token counted once (DOMAIN.md section 6): a file that repeats a token `(run_id, seq_id, minibatch,
pos)` of another file is refused by `replay` (against the store, whichever replay stored it) and reported
by `validate` (across the files of one call), naming the file that holds the tokens first."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from evaluator.cli import cli
from evaluator.cli.common import EXIT_FINDINGS, EXIT_OK
from evaluator.logio import write_log_atomic
from evaluator.replay.pipeline import replay
from evaluator.store import connect_store
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps
from evaluator.validate import validate_paths

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SOURCE = sorted(FIXTURES.glob("recompute-*.parquet"))[0]


def resave(source: Path, target: Path, compression: str) -> Path:
    """The same table written again with another codec (other bytes, so another digest)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pq.read_table(source), target, compression=compression)
    assert target.read_bytes() != source.read_bytes()
    return target


def counts(db: Path) -> dict[str, int]:
    with connect_store(db) as con:
        tables = ("ingested_file", "file_sequences", "file_tokens", "metric_moments", "sketch_by_step")
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}


def run_tokens(db: Path, run_id: str) -> int:
    with connect_store(db) as con:
        sql = "SELECT n FROM run_summary WHERE run_id = ? AND method = 'rollout' AND metric = 'approx_logp'"
        return con.execute(sql, [run_id]).fetchone()[0]


@pytest.fixture(scope="module")
def source_stored(tmp_path_factory) -> Path:
    """A store of `SOURCE` alone, replayed once for the module (tests that write to it take a copy)."""
    db = tmp_path_factory.mktemp("source") / "m"
    assert replay([SOURCE], db).n_ingested == 1
    return db


@pytest.fixture
def fixture_copy(tmp_path) -> tuple[Path, Path]:
    """A real fixture file and the same log re-saved with snappy (the fixtures are zstd)."""
    (tmp_path / "logs").mkdir()
    original = Path(shutil.copy(SOURCE, tmp_path / "logs" / "a.parquet"))
    return original, resave(SOURCE, tmp_path / "logs" / "b.parquet", "snappy")


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "workers"])
def test_a_resaved_fixture_is_reported_as_a_copy_and_the_run_counted_once(
    tmp_path, fixture_copy, source_stored, workers
):
    original, copy = fixture_copy
    alone = source_stored  # the same bytes as `original`, replayed alone
    db = tmp_path / "m"
    report = replay([original.parent], db, workers=workers)
    assert [(o.path.name, o.status) for o in report.outcomes] == [
        ("a.parquet", "ingested"),
        ("b.parquet", "copy"),
    ]
    assert report.outcomes[1].copy_of == str(original.resolve()) and report.outcomes[1].resaved
    assert report.clean  # a copy is not a broken rule
    assert counts(db) == counts(alone)  # nothing of the copy is stored
    assert run_tokens(db, "recompute") == run_tokens(alone, "recompute")


def test_the_cli_names_the_file_a_resaved_copy_copies(tmp_path, fixture_copy):
    original, copy = fixture_copy
    result = CliRunner().invoke(cli, ["replay", str(original.parent), "--db", str(tmp_path / "m")])
    assert result.exit_code == EXIT_OK, result.output
    line = next(line for line in result.output.splitlines() if line.startswith(str(copy)))
    assert line == (
        f"{copy}: a re-saved copy of {original.resolve()} (the same tokens and values, other bytes), "
        "ingested from there: not counted again"
    )


def test_a_later_replay_reports_a_resaved_copy_of_a_stored_file(tmp_path, fixture_copy, source_stored):
    _, copy = fixture_copy
    db = Path(shutil.copytree(source_stored, tmp_path / "m"))  # `SOURCE` stored
    before = counts(db)
    (outcome,) = replay([copy], db).outcomes
    assert (outcome.status, outcome.copy_of, outcome.resaved) == ("copy", str(SOURCE.resolve()), True)
    assert counts(db) == before


def test_byte_copies_name_the_file_they_copy_and_the_same_file_is_already_ingested(tmp_path, fixture_copy):
    """The same bytes under another path are a copy of the file ingested first, in one call or a later
    one; the same file replayed again is "already ingested, unchanged"."""
    original, _ = fixture_copy
    twin = Path(shutil.copy(original, tmp_path / "twin.parquet"))
    db = tmp_path / "m"
    first, in_call = replay([original, twin], db).outcomes
    assert first.status == "ingested" and (in_call.status, in_call.copy_of) == ("copy", original)
    assert in_call.line() == (
        f"{twin}: a copy of {original} (the same bytes), ingested from there: not counted again"
    )
    again, later = replay([original, twin], db).outcomes
    assert again.line() == f"{original}: already ingested, unchanged"
    assert (later.status, later.copy_of, later.resaved) == ("copy", str(original.resolve()), False)


def test_a_copy_with_its_sequences_in_another_order_is_still_a_copy(tmp_path):
    """Another writer may order the sequences otherwise: the sums then add in another order and differ in
    their last bits (with SUM_TOLERANCE 0 this copy is refused as a duplicate), the tokens and values not."""
    table = pq.read_table(SOURCE)
    seq, minibatch, pos = (table[c].to_numpy() for c in ("seq_id", "minibatch", "pos"))
    reordered = tmp_path / "reordered.parquet"
    pq.write_table(table.take(pa.array(np.lexsort((pos, -minibatch, -seq)))), reordered)
    first, copy = replay([SOURCE, reordered], tmp_path / "m").outcomes
    assert first.status == "ingested" and (copy.status, copy.copy_of) == ("copy", str(SOURCE.resolve()))


def test_the_same_tokens_with_other_values_or_part_of_a_file_are_duplicates_not_copies(
    tmp_path, source_stored
):
    """A second training under the same run_id (the same seq_ids, other log-probs) and a file holding part
    of a stored file's sequences repeat tokens: refused with duplicate_across_files, never a copy."""
    table = pq.read_table(SOURCE)
    other = table.set_column(
        table.schema.get_field_index("behave_logp"),
        "behave_logp",
        pc.subtract(table["behave_logp"], pa.scalar(1e-4, pa.float32())),  # every token, barely
    )
    half = table.filter(pc.less(table["seq_id"], pc.min(table["seq_id"]).as_py() + 20))
    db = Path(shutil.copytree(source_stored, tmp_path / "m"))  # `SOURCE` stored
    for name, variant in (("other-values", other), ("part", half)):
        path = tmp_path / f"{name}.parquet"
        pq.write_table(variant, path)
        (outcome,) = replay([path], db).outcomes
        assert outcome.status == "skipped" and outcome.problems[0].rule == "duplicate_across_files", name


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
    report = replay([tmp_path / "logs"], tmp_path / "m")
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
    result = CliRunner().invoke(cli, ["replay", str(tmp_path / "logs"), "--db", str(tmp_path / "m")])
    assert result.exit_code == EXIT_OK, result.output
