"""Replay's batches hold whole sequences (`evaluator.replay.reading`): every row once, in order, no sequence
cut in two, the same batches however a file is cut into ranges; and a file whose sequences are not
contiguous is replayed from a sorted copy, to the same summary as the sorted file."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evaluator.formulas.loss import Loss
from evaluator.logio import write_log_atomic
from evaluator.replay.pipeline import check_and_summarise
from evaluator.replay.reading import iter_batches
from evaluator.replay.summarise import batch_ranges
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps

COLUMNS = ["run_id", "seq_id", "minibatch", "pos", "behave_logp"]


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    """Sequences of 1 to ~300 tokens, several row groups (batches of 100 rows cut most of them)."""
    spec = SyntheticSpec(run_id="r", tokens_per_step=1500, mean_length=60, n_minibatches=2)
    table = synthetic_steps(spec, 0, 3)
    path = tmp_path_factory.mktemp("reading") / "log.parquet"
    pq.write_table(table, path, row_group_size=777)
    return path


def keys(batch: pa.RecordBatch) -> list[tuple]:
    return list(zip(*(batch.column(k).to_pylist() for k in ("run_id", "seq_id", "minibatch")), strict=True))


def test_every_row_once_in_order_and_no_sequence_cut(log):
    batches = list(iter_batches(log, COLUMNS, 100))
    whole = pq.read_table(log, columns=COLUMNS)
    assert pa.Table.from_batches(batches).equals(whole.combine_chunks().cast(batches[0].schema))
    ends = [(keys(b)[0], keys(b)[-1]) for b in batches]
    for (_, last), (first, _) in zip(ends[:-1], ends[1:], strict=True):
        assert last != first  # the next batch starts a new sequence
    seen = [k for b in batches for k in dict.fromkeys(keys(b))]
    assert len(seen) == len(set(seen))  # each sequence in one batch only
    assert max(b.num_rows for b in batches) > 100 and len(batches) > 10


@pytest.mark.parametrize("workers", [2, 3, 7])
def test_ranges_read_the_very_batches_of_the_whole_file(log, workers):
    n_rows = pq.ParquetFile(log).metadata.num_rows
    whole = [b.to_pydict() for b in iter_batches(log, COLUMNS, 100)]
    ranges = batch_ranges(n_rows, 100, workers)
    assert len(ranges) == workers
    parts = [b.to_pydict() for r in ranges for b in iter_batches(log, COLUMNS, 100, r)]
    assert parts == whole


def test_a_file_of_interleaved_sequences_is_summarised_as_its_sorted_copy(log, tmp_path):
    """Rows shuffled in blocks, so sequences are not contiguous: the summary under a sequence-level loss
    equals the sorted file's (a sequence cut across batches would change its GSPO ratio)."""
    table = pq.read_table(log)
    order = np.random.default_rng(0).permutation(table.num_rows // 50 + 1)
    rows = np.concatenate([np.arange(i * 50, min((i + 1) * 50, table.num_rows)) for i in order])
    shuffled = write_log_atomic(table.take(rows), tmp_path / "shuffled.parquet")
    by_sequence = [(k, "ascending") for k in ("run_id", "seq_id", "minibatch", "pos")]
    ordered = write_log_atomic(table.sort_by(by_sequence), tmp_path / "sorted.parquet")
    gspo = Loss(ratio_level="sequence")
    a, b = (check_and_summarise(p, gspo, batch_rows=100).summary for p in (shuffled, ordered))
    for name in ("moments", "sketch_by_step", "sketch_by_staleness", "file_tokens"):
        left, right = (getattr(s, name).to_pandas() for s in (a, b))
        cols = list(left.columns)
        for frame in (left, right):
            for c in ("run_id", "method", "metric"):
                if c in frame:
                    frame[c] = frame[c].astype(str)
        left, right = (f.sort_values(cols[:-1]).reset_index(drop=True) for f in (left, right))
        np.testing.assert_array_equal(left.select_dtypes("number").shape, right.select_dtypes("number").shape)
        assert (
            left[cols]
            .drop(columns=[c for c in ("sum", "sum_sq") if c in cols])
            .equals(right[cols].drop(columns=[c for c in ("sum", "sum_sq") if c in cols]))
        ), name
        for c in ("sum", "sum_sq"):
            if c in cols:
                np.testing.assert_allclose(left[c], right[c], rtol=1e-12)
