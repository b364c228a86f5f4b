"""File-level accumulators and range threads of replay: neither changes a number of the summary."""

from __future__ import annotations

import threading

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evaluator.formulas.loss import DEFAULT_LOSS
from evaluator.formulas.sketch import bucket_code
from evaluator.logio import write_log_atomic
from evaluator.replay import accumulators as summary_accumulators
from evaluator.replay import histograms as counting
from evaluator.replay import summarise as file_summary
from evaluator.replay.accumulators import CellIndex, SketchCounts
from evaluator.replay.batch import SERIES_ID, CellRows, Summaries, add_series, group_tokens
from evaluator.replay.kernels import histograms as compiled
from evaluator.replay.pipeline import check_and_summarise
from evaluator.replay.tasks import SummariseRange
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps


def summarise_file(log, **options):
    """The file's summary as replay makes it (after the validator's facts)."""
    return check_and_summarise(log, **options).summary


def _merged(table: pa.Table) -> pl.DataFrame:
    """Counts summed per key, as the store does at ingest."""
    frame = pl.from_arrow(table).with_columns(pl.col("run_id", "method", "metric").cast(pl.String))
    keys = [c for c in frame.columns if c != "count"]
    return frame.group_by(keys).agg(pl.col("count").sum()).sort(keys)


def test_flushing_every_batch_gives_the_same_summaries(tmp_path, monkeypatch):
    spec = SyntheticSpec(run_id="r", tokens_per_step=2048, mean_length=16)
    log = write_log_atomic(synthetic_steps(spec, 0, 6), tmp_path / "log.parquet")
    spills, spill = [], SketchCounts._spill
    monkeypatch.setattr(SketchCounts, "_spill", lambda self: spills.append(1) or spill(self))
    whole = summarise_file(log, batch_rows=1000)
    whole_spills = len(spills)
    monkeypatch.setattr(summary_accumulators, "DENSE_BUDGET", 0)  # flush after every batch
    flushed = summarise_file(log, batch_rows=1000)
    assert len(spills) - whole_spills > whole_spills  # the flushes did happen
    for name in ("sketch_by_step", "sketch_by_staleness"):
        assert _merged(getattr(flushed, name)).equals(_merged(getattr(whole, name)))
    assert flushed.moments.equals(whole.moments)
    assert flushed.file_tokens.equals(whole.file_tokens)


def test_a_file_s_sketch_rows_are_summed_per_key_in_the_store_s_order(tmp_path, monkeypatch):
    """The rows a file stages as they are: one per key (the spills of a batch and the ranges of a file
    repeat keys), sorted by run_id, method, metric, step or staleness, bucket."""
    monkeypatch.setattr(summary_accumulators, "DENSE_BUDGET", 0)  # every batch's rows repeat keys
    tables = [
        synthetic_steps(SyntheticSpec(run_id=run, tokens_per_step=512), 0, 4) for run in ("zeta", "alpha")
    ]
    log = write_log_atomic(pa.concat_tables(tables), tmp_path / "log.parquet")
    summary = summarise_file(log, batch_rows=500)
    for name, level in (("sketch_by_step", "step"), ("sketch_by_staleness", "staleness")):
        frame = pl.from_arrow(getattr(summary, name)).with_columns(
            pl.col("run_id", "method", "metric").cast(pl.String)
        )
        keys = ["run_id", "method", "metric", level, "bucket"]
        assert frame.equals(_merged(getattr(summary, name)).select(frame.columns).sort(keys)), name
        assert frame["run_id"].unique(maintain_order=True).to_list() == ["alpha", "zeta"]


def test_packed_keys_order_rows_as_the_keys_do_even_past_63_bits():
    """Four keys of 60,000 distinct values each (their codes' product passes 2^62: the packed key is ranked
    anew on the way) and keys with values far apart: the packed key sorts the rows as `np.lexsort` does."""
    rng = np.random.default_rng(0)
    wide = [rng.permutation(60_000) - 30_000 for _ in range(4)]
    sparse = [
        rng.integers(0, 3, 60_000),
        rng.choice([-(2**40), 0, 5, 2**50], 60_000),
        rng.integers(0, 9, 60_000),
    ]
    for keys in (wide, sparse):
        packed = file_summary._packed(keys)
        expected = np.lexsort(keys[::-1])
        assert np.array_equal(np.argsort(packed, kind="stable"), expected)
        equal_next = np.all([k[expected][1:] == k[expected][:-1] for k in keys], axis=0)
        assert np.array_equal(np.diff(packed[expected]) == 0, equal_next)


def test_sketch_counts_widen_their_bucket_range_and_add():
    counts = SketchCounts(("run", "step"))
    rows = counts.cells.rows({"run": np.array([0, 0]), "step": np.array([5, 6])})
    counts.add(0, rows, 10, np.array([[1, 2], [3, 0]]))  # buckets 10, 11
    rows = counts.cells.rows({"run": np.array([0]), "step": np.array([6])})
    counts.add(0, rows, 8, np.array([[4, 0, 1, 0, 0, 7]]))  # buckets 8..13 of step 6
    [out] = counts.rows()
    got = sorted(zip(out["step"].tolist(), out["bucket"].tolist(), out["count"].tolist(), strict=True))
    assert got == [(5, 10, 1), (5, 11, 2), (6, 8, 4), (6, 10, 4), (6, 13, 7)]


def test_dense_counts_stay_within_their_budget_inside_a_batch(monkeypatch):
    """Many cells in one batch times a wide bucket range: the dense counts spill to sparse rows as soon as
    they pass the budget, not only between batches (a 20,000-row log of 1,250 steps of 16 tokens made
    replay peak at 2.4 GB), and every count is kept."""
    monkeypatch.setattr(summary_accumulators, "DENSE_BUDGET", 5000)
    counts, rng, expected = SketchCounts(("run", "step")), np.random.default_rng(0), {}
    rows = counts.cells.rows({"run": np.zeros(100, dtype=np.int64), "step": np.arange(100) * 7})
    for series in range(20):
        lo, block = int(rng.integers(-50, 50)), rng.integers(0, 3, size=(100, 40))
        counts.add(series, rows, lo, block)
        assert counts.size() <= 5000
        for (cell, offset), n in np.ndenumerate(block):
            if n:
                key = (series, 7 * cell, lo + offset)
                expected[key] = expected.get(key, 0) + int(n)
    got: dict[tuple, int] = {}
    for part in counts.rows():
        columns = (part[k].tolist() for k in ("series", "step", "bucket", "count"))
        for series, step, bucket, n in zip(*columns, strict=True):
            got[series, step, bucket] = got.get((series, step, bucket), 0) + n
    assert got == expected


def test_cell_index_numbers_cells_in_order_of_first_sight():
    index = CellIndex(("run", "step"))
    first = index.rows({"run": np.array([1, 0]), "step": np.array([3, 3])})
    again = index.rows({"run": np.array([0, 2]), "step": np.array([3, 1])})
    assert first.tolist() == [0, 1] and again.tolist() == [1, 2]
    assert index.labels()["run"].tolist() == [1, 0, 2]


def test_sketch_counts_do_not_depend_on_batch_size(tmp_path):
    """Large batches of few steps take the kernel's group-row path (counts per (run, step, staleness),
    then their step and staleness marginals), tiny ones its direct path (each token into its two rows):
    same counts."""
    spec = SyntheticSpec(run_id="r", tokens_per_step=40_000, mean_length=64)
    log = write_log_atomic(synthetic_steps(spec, 0, 2), tmp_path / "log.parquet")
    large, tiny = summarise_file(log, batch_rows=1 << 17), summarise_file(log, batch_rows=500)
    for name in ("sketch_by_step", "sketch_by_staleness"):
        assert _merged(getattr(large, name)).equals(_merged(getattr(tiny, name)))


def test_range_threads_give_the_same_summary_bit_for_bit(tmp_path):
    """Ranges of whole batches cut across row groups (777 rows) that do not line up with the batches
    (1,000 rows); merged in file order, every number matches one process's, sums included."""
    spec = SyntheticSpec(run_id="r", tokens_per_step=3000, mean_length=16)
    log = tmp_path / "log.parquet"
    pq.write_table(synthetic_steps(spec, 0, 4), log, row_group_size=777)
    one = summarise_file(log, batch_rows=1000, workers=1)
    three = summarise_file(log, batch_rows=1000, workers=3)
    assert (three.n_rows, three.n_tokens) == (one.n_rows, one.n_tokens)
    assert three.moments.equals(one.moments) and three.file_tokens.equals(one.file_tokens)
    for name in ("sketch_by_step", "sketch_by_staleness"):
        assert _merged(getattr(three, name)).equals(_merged(getattr(one, name)))


def test_a_file_of_four_batches_is_cut_in_two_range_threads_here_and_a_cluster_wants_eight_a_task(
    monkeypatch,
):
    """A 1M-token file (four batches of 2^18 rows, the last one short) is summarised by two threads on two
    cores; three batches are one range; never more threads than cores; a cluster's range task takes eight
    batches."""
    monkeypatch.setattr(file_summary, "usable_cores", lambda: 2)
    batch = file_summary.BATCH_ROWS
    assert file_summary.default_workers(3 * batch + 1) == 2
    assert file_summary.default_workers(3 * batch) == 1
    assert file_summary.default_workers(2 * batch) == 1
    assert file_summary.default_workers(100 * batch) == 2
    assert file_summary.default_workers(16 * batch, cores=4) == 2
    assert file_summary.default_workers(15 * batch + 1, cores=4) == 2
    assert file_summary.default_workers(15 * batch, cores=4) == 1


def test_a_failing_range_fails_the_file(tmp_path, monkeypatch):
    """The error of one range's thread is the file's (replay reports it as that file's failure)."""
    spec = SyntheticSpec(run_id="r", tokens_per_step=3000, mean_length=16)
    log = write_log_atomic(synthetic_steps(spec, 0, 2), tmp_path / "log.parquet")
    real = file_summary.summarise_range

    def second_range_fails(task, **options):
        if task.rows[0] > 0:
            raise OSError("the disk went away")
        return real(task, **options)

    monkeypatch.setattr(file_summary, "summarise_range", second_range_fails)
    with pytest.raises(OSError, match="the disk went away"):
        summarise_file(log, batch_rows=1000, workers=2)


def test_a_range_stops_at_the_next_batch_once_its_caller_gives_up(tmp_path):
    """The stop event set by `summarise_file` on an error or Ctrl-C: the other ranges end early."""
    spec = SyntheticSpec(run_id="r", tokens_per_step=3000, mean_length=16)
    log = write_log_atomic(synthetic_steps(spec, 0, 2), tmp_path / "log.parquet")
    resumes = check_and_summarise(log).checked.facts.resumes
    stop = threading.Event()
    task = SummariseRange(log, None, resumes, DEFAULT_LOSS, 1000)
    whole = file_summary.summarise_range(task, stop=stop)
    stop.set()
    stopped = file_summary.summarise_range(task, stop=stop)
    assert whole.n_rows == pq.ParquetFile(log).metadata.num_rows and stopped.n_rows == 0


def test_batch_ranges_are_whole_batches_covering_the_file():
    assert file_summary.batch_ranges(10_500, 1000, 2) == [(0, 6000), (6000, 10_500)]
    assert file_summary.batch_ranges(900, 1000, 2) == [(0, 900)]


@pytest.mark.parametrize("histograms", [compiled, counting.histograms], ids=["compiled", "numpy"])
@pytest.mark.parametrize("n_groups", [3, 400])  # group rows fewer than the tokens, and more
def test_the_sketch_kernel_counts_what_bincount_counts(n_groups, histograms):
    """Both of the kernel's paths, and the numpy path of a small batch, against bincount: buckets of every
    sign, zeros of both signs, subnormals and infinities, each token counted in its (run, step) and (run,
    staleness) rows."""
    rng = np.random.default_rng(3)
    values = np.concatenate(
        [
            rng.standard_normal(5000) * 10.0 ** rng.integers(-12, 12, 5000),
            [0.0, -0.0, 5e-324, -5e-324, np.inf, -np.inf, 2.0**-40, -(2.0**-41)],
        ]
    )
    group = np.sort(rng.integers(0, n_groups, len(values)))
    step_of_group, stale_of_group = rng.integers(0, 4, n_groups), rng.integers(0, 7, n_groups)
    codes = bucket_code(values)
    lo, span = int(codes.min()), int(codes.max() - codes.min()) + 1
    assert len(values) < counting.COMPILED_FROM  # the dispatcher takes its numpy path
    by_step, by_stale = histograms(values, group, step_of_group, stale_of_group, lo, span, 4, 7)
    for rows, n_rows, got in ((step_of_group, 4, by_step), (stale_of_group, 7, by_stale)):
        assert got.dtype == np.int64
        keys = rows[group] * span + (codes - lo)
        np.testing.assert_array_equal(got, np.bincount(keys, minlength=n_rows * span).reshape(n_rows, span))


def test_a_nan_metric_value_is_an_error_naming_its_series():
    acc = Summaries()
    groups = group_tokens(np.zeros(3, np.int64), np.ones(3, np.int64), np.zeros(3, np.int64))[1]
    rows = CellRows(
        acc.moments.cells.rows(groups.cells.labels),
        acc.by_step.cells.rows(groups.cells.step_labels),
        acc.by_staleness.cells.rows(groups.cells.stale_labels),
    )
    acc.moments.add_tokens(rows.group, np.array([3]), np.array([3]))
    with pytest.raises(ValueError, match=r"\('loglinear', 'abs_error'\) has a NaN"):
        add_series(acc, SERIES_ID["loglinear", "abs_error"], np.array([0.5, np.nan, 1.0]), groups, rows)


@pytest.mark.parametrize("histograms", [compiled, counting.histograms], ids=["compiled", "numpy"])
def test_the_sketch_kernel_buckets_any_float_as_bucket_code_does(histograms):
    """Random float64 bit patterns (NaN aside): every exponent, both signs, subnormals."""
    bits = np.random.default_rng(1).integers(-(2**63), 2**63 - 1, 20_000, dtype=np.int64)
    values = bits.view(np.float64)
    values = values[~np.isnan(values)]
    codes = bucket_code(values)
    lo, span = int(codes.min()), int(codes.max() - codes.min()) + 1
    one_group = np.zeros(len(values), dtype=np.int64)
    by_step, _ = histograms(values, one_group, np.zeros(1, np.int64), np.zeros(1, np.int64), lo, span, 1, 1)
    np.testing.assert_array_equal(by_step[0], np.bincount(codes - lo, minlength=span))


def test_a_file_summarised_by_numpy_counts_equals_the_compiled_loops(tmp_path, monkeypatch):
    """The same file, its sketch counts taken by numpy (batches under `COMPILED_FROM` tokens) and then by the
    compiled loop (every batch): every summary table is equal, row for row."""
    spec = SyntheticSpec(run_id="r", tokens_per_step=2048, mean_length=16)
    log = write_log_atomic(synthetic_steps(spec, 0, 6), tmp_path / "log.parquet")
    by_numpy = summarise_file(log, batch_rows=4096)
    assert by_numpy.n_tokens < counting.COMPILED_FROM
    monkeypatch.setattr(counting, "COMPILED_FROM", 1)
    by_loop = summarise_file(log, batch_rows=4096)
    for name in ("file_tokens", "moments", "sketch_by_step", "sketch_by_staleness"):
        assert getattr(by_numpy, name).equals(getattr(by_loop, name)), name
    assert by_numpy.sketch_by_step.num_rows > 0


def test_summed_adds_each_key_s_counts_over_parts_and_frees_them_as_it_goes():
    """`_summed` on hand-made parts (spills of one series each, one of several series, an empty one, two
    runs whose names sort against their codes): one row per key with its counts added, in the store's
    order (run_id, method, metric, staleness, bucket), against a count by key in plain Python; the parts'
    list is emptied."""
    rng = np.random.default_rng(7)
    runs = ["zeta", "alpha"]  # code 0 sorts last
    series_ids = [0, 5, 17, len(file_summary.SERIES) - 1]

    def part(series):
        n = 400
        return {
            "run": rng.integers(0, 2, n),
            "staleness": rng.integers(0, 4, n),
            "series": np.asarray(series if np.ndim(series) else np.full(n, series)),
            "bucket": rng.integers(-30, 30, n),
            "count": rng.integers(1, 9, n),
        }

    parts = [part(s) for s in series_ids for _ in range(3)] + [part(rng.choice(series_ids, 400))]
    parts.append({k: v[:0] for k, v in parts[0].items()})
    expected: dict[tuple, int] = {}
    for p in parts:
        for run, stale, series, bucket, count in zip(*(p[k].tolist() for k in p), strict=True):
            key = (run, stale, series, bucket)
            expected[key] = expected.get(key, 0) + count
    ordered = sorted(expected, key=lambda k: (runs[k[0]], *file_summary.SERIES[k[2]], k[1], k[3]))
    rows = list(parts)
    out = file_summary._summed(rows, runs, "staleness")
    assert rows == []
    got = list(zip(*(out[k].tolist() for k in ("run", "staleness", "series", "bucket")), strict=True))
    assert got == ordered
    assert out["count"].tolist() == [expected[k] for k in ordered]
