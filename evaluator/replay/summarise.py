"""Mergeable summaries of one token log, streamed over record batches and spread over CPU cores.

A file is read in record batches of whole sequences, about `BATCH_ROWS` rows each
(`evaluator.replay.reading`; `evaluator.replay.batch` summarises each). A file whose sequences are not
contiguous is replayed from a copy sorted by sequence (the batches would cut its sequences). A
long file is cut into contiguous ranges of whole batches, one per thread (Parquet decoding, numpy on
whole arrays and the compiled sketch loop of `evaluator.replay.kernels` release the GIL), or one per task
on a cluster; each reads only its rows. The caller merges the ranges in file order: sketch counts are
integers (the store sums repeated rows), and the moments come back batch by batch, so every sum is
folded in batch order exactly as in one range: the summary does not depend on the number of ranges, bit
for bit.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from evaluator.errors import FileFailed
from evaluator.formulas.loss import DEFAULT_LOSS, Loss
from evaluator.replay.accumulators import Moments
from evaluator.replay.batch import INPUT_COLUMNS, SERIES, Summaries, add_batch, dense_codes, first_of_runs
from evaluator.replay.pairing import resumes_frame
from evaluator.replay.reading import iter_batches, sequence_starts, sorted_copy
from evaluator.replay.sampling import sampled
from evaluator.store import FileSummary

BATCH_ROWS = 1 << 18
MIN_BATCHES_PER_THREAD = 2
"""Range threads here cut a file of at least this many batches a thread (a 1M-token file: two threads, 2.3x
faster on 2 cores, BENCHMARKS.md; the ranges are folded batch by batch in file order, so the numbers are
the same whatever the cut)."""
MIN_BATCHES_PER_TASK = 8
"""A range on a cluster costs a task: give each at least 2M rows."""
Rows = dict[str, np.ndarray]


@dataclass(frozen=True)
class SummariseRange:
    """Summarise rows [start, end) of a long file (`rows` None: all of it) in record batches of
    `batch_rows`, the fraction `sample` of its sequences (`evaluator.replay.sampling`): a `RangeSummary`,
    merged with the file's other ranges in file order."""

    path: Path
    rows: tuple[int, int] | None
    resumes: pa.Table
    loss: Loss
    batch_rows: int
    sample: float = 1.0
    kind = "summarise_range"

    def run(self, on_batch: Callable[[int], None] | None = None, stop: threading.Event | None = None):
        return summarise_range(self, on_batch=on_batch, stop=stop)


@dataclass
class RangeSummary:
    """A range of a file's batches, summarised (`run` labels are codes into `runs`)."""

    runs: list[str]
    n_rows: int = 0
    n_tokens: int = 0
    n_sequence_runs: int = 0  # rows that start a sequence: the file's sequences if they are contiguous
    batch_moments: list[tuple[Rows, Rows]] = field(default_factory=list)  # per batch: tokens, moments
    by_step: list[Rows] = field(default_factory=list)
    by_staleness: list[Rows] = field(default_factory=list)


def summarise_range(
    task: SummariseRange, on_batch: Callable[[int], None] | None = None, stop: threading.Event | None = None
) -> RangeSummary:
    """Summarise the task's rows with the file's resumed-segment starts and the loss's thresholds: what one
    range worker does. Once `stop` is set it returns at the next batch, unfinished (its caller has given
    up)."""
    acc, runs, resumes = Summaries(), {}, resumes_frame(task.resumes)
    out = RangeSummary(runs=[])
    for batch in iter_batches(task.path, INPUT_COLUMNS, task.batch_rows, task.rows):
        if stop is not None and stop.is_set():
            break
        out.n_sequence_runs += int(sequence_starts(batch, None).sum())
        batch_rows = batch.num_rows
        out.n_rows += batch_rows
        batch = sampled(batch, task.sample)
        acc.moments = Moments(len(SERIES))  # this batch's alone: the parent folds them in file order
        out.n_tokens += add_batch(acc, batch, runs, resumes, task.loss)
        out.batch_moments.append((acc.moments.token_rows(), acc.moments.moment_rows()))
        if on_batch is not None:
            on_batch(batch_rows)
    out.runs, out.by_step, out.by_staleness = list(runs), acc.by_step.rows(), acc.by_staleness.rows()
    return out


def batch_ranges(n_rows: int, batch_rows: int, workers: int) -> list[tuple[int, int]]:
    """`workers` contiguous row ranges of whole batches, as even as batches allow."""
    n_batches = -(-n_rows // batch_rows)
    cuts = [round(i * n_batches / workers) * batch_rows for i in range(workers + 1)]
    return [(lo, min(hi, n_rows)) for lo, hi in zip(cuts[:-1], cuts[1:], strict=True) if lo < hi]


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_workers(n_rows: int, batch_rows: int = BATCH_ROWS, cores: int | None = None) -> int:
    """One range thread per usable core, but no more than the file has `MIN_BATCHES_PER_THREAD` batches
    (the last one perhaps short) for; or one range task per CPU of a cluster (`cores`), each of
    `MIN_BATCHES_PER_TASK` batches."""
    if cores is None:
        cores, least = usable_cores(), MIN_BATCHES_PER_THREAD
    else:
        least = MIN_BATCHES_PER_TASK
    return max(1, min(cores, -(-n_rows // batch_rows) // least))


RangeMap = Callable[[list[SummariseRange]], Iterator[RangeSummary | FileFailed]]
"""A cluster's ordered map over range tasks (`evaluator.replay.ray_runner.RayRunner.map`)."""


def _in_threads(tasks: list[SummariseRange], on_batch: Callable[[int], None] | None) -> list[RangeSummary]:
    """The ranges in threads of this process, returned in file order; a range's error is the file's."""
    stop = threading.Event()  # an error or Ctrl-C here: every range stops at its next batch
    with ThreadPoolExecutor(len(tasks), thread_name_prefix="proxaudit-range") as threads:
        futures = [threads.submit(task.run, stop=stop) for task in tasks]
        try:
            parts = []
            for task, future in zip(tasks, futures, strict=True):
                parts.append(future.result())
                if on_batch is not None:
                    on_batch(task.rows[1] - task.rows[0])
            return parts
        except BaseException:
            stop.set()
            raise


def _on_cluster(
    tasks: list[SummariseRange], range_map: RangeMap, on_batch: Callable[[int], None] | None
) -> list[RangeSummary]:
    """The ranges as tasks of a cluster, returned in file order; a range's failure is the file's."""
    parts = []
    for task, part in zip(tasks, range_map(tasks), strict=True):
        if isinstance(part, FileFailed):
            raise part
        parts.append(part)
        if on_batch is not None:
            on_batch(task.rows[1] - task.rows[0])
    return parts


def _table(rows: list[Rows], runs: list[str], columns: tuple[str, ...]) -> pa.Table:
    """Concatenate row parts; `run` and `series` codes become run_id, method, metric strings."""
    data = {k: np.concatenate([r[k] for r in rows]) if rows else np.zeros(0, np.int64) for k in columns}
    out = {
        "run_id": pa.DictionaryArray.from_arrays(
            data.pop("run").astype(np.int32), pa.array(runs, pa.string())
        )
    }
    if "series" in data:
        series = data.pop("series").astype(np.int32)
        for i, name in enumerate(("method", "metric")):
            labels = sorted({s[i] for s in SERIES})
            code = np.array([labels.index(s[i]) for s in SERIES], dtype=np.int32)
            out[name] = pa.DictionaryArray.from_arrays(code[series], pa.array(labels, pa.string()))
    out.update({k: pa.array(v) for k, v in data.items() if k != "run"})
    return pa.table(out)


def _with_runs(rows: Rows, codes: np.ndarray) -> Rows:
    """`rows` with its range's run codes replaced by the file's."""
    return {**rows, "run": codes[rows["run"]]}


def summarise_file(
    path,
    resumes: pa.Table,
    loss: Loss = DEFAULT_LOSS,
    *,
    n_sequences: int | None = None,
    on_batch: Callable[[int], None] | None = None,
    batch_rows: int = BATCH_ROWS,
    workers: int | None = None,
    range_map: RangeMap | None = None,
    sample: float = 1.0,
) -> FileSummary:
    """Stream `path` batch by batch into its mergeable summaries, on `workers` threads (default: one per
    core for a long file, else none), or as `workers` range tasks of `range_map` (an ordered map over
    tasks, `evaluator.replay.ray_runner.RayRunner.map`). `resumes`: the file's `FileFacts.resumes`;
    `loss`: the loss the decision metrics are computed under; `n_sequences`: the file's sequences (its
    `FileFacts.sequences` rows), to check that they are contiguous (if not, a sorted copy is replayed);
    `sample`: the fraction of sequences summarised (`evaluator.replay.sampling`; `n_rows` stays the
    file's). `on_batch(rows)` reports progress."""
    n_rows = pq.ParquetFile(path).metadata.num_rows
    workers = default_workers(n_rows, batch_rows) if workers is None else workers
    ranges = batch_ranges(n_rows, batch_rows, workers)
    whole = SummariseRange(path, None, resumes, loss, batch_rows, sample)
    if len(ranges) < 2:
        parts = [summarise_range(whole, on_batch)]
    elif range_map is not None:
        parts = _on_cluster([replace(whole, rows=r) for r in ranges], range_map, on_batch)
    else:
        parts = _in_threads([replace(whole, rows=r) for r in ranges], on_batch)
    if n_sequences is not None and sum(p.n_sequence_runs for p in parts) != n_sequences:
        with tempfile.TemporaryDirectory(prefix="proxaudit-sorted-") as folder:
            copy = os.path.join(folder, "sorted.parquet")
            sorted_copy(path, copy)
            return summarise_file(
                copy, resumes, loss, batch_rows=batch_rows, workers=workers, range_map=None, sample=sample
            )
    return _merged(parts)


def _merged(parts: list[RangeSummary]) -> FileSummary:
    """A file's summary from its ranges' (in file order), every sum folded batch by batch in file order."""
    runs: dict[str, int] = {}
    moments, by_step, by_staleness = Moments(len(SERIES)), [], []
    for part in parts:  # in file order
        codes = np.array([runs.setdefault(r, len(runs)) for r in part.runs], dtype=np.int64)
        for tokens, batch_moments in part.batch_moments:
            moments.fold(_with_runs(tokens, codes), _with_runs(batch_moments, codes))
        by_step += [_with_runs(r, codes) for r in part.by_step]
        by_staleness += [_with_runs(r, codes) for r in part.by_staleness]
        part.by_step, part.by_staleness = [], []  # handed over: `_summed` frees each series' rows once added
    names = list(runs)
    return FileSummary(
        n_rows=sum(p.n_rows for p in parts),
        n_tokens=sum(p.n_tokens for p in parts),
        file_tokens=_table([moments.token_rows()], names, ("run", "step", "staleness", "n_tokens", "n_prox")),
        moments=_table(
            [moments.moment_rows()],
            names,
            ("run", "step", "staleness", "series", "n", "sum", "sum_sq", "min", "max"),
        ),
        sketch_by_step=_table([_summed(by_step, names, "step")], names, _SKETCH_COLUMNS["step"]),
        sketch_by_staleness=_table(
            [_summed(by_staleness, names, "staleness")], names, _SKETCH_COLUMNS["staleness"]
        ),
    )


_SKETCH_COLUMNS = {level: ("run", level, "series", "bucket", "count") for level in ("step", "staleness")}
_SERIES_RANK = np.argsort(sorted(range(len(SERIES)), key=SERIES.__getitem__))
"""Each series' place in (method, metric) order, as the store sorts its rows."""


def _summed(rows: list[Rows], runs: list[str], level: str) -> Rows:
    """Sketch rows with the counts of equal (run, `level`, series, bucket) added (the spills of a range
    and the ranges of a file repeat keys), sorted as the store keeps them: run_id, method, metric,
    `level`, bucket (`evaluator.store.staging` writes them as they come). One series at a time, `rows`
    emptied as it goes: a late file of watch's benchmark spills 3.4M rows of 1.9M keys, and adding them all
    at once held them twice over, with their sort keys."""
    columns = _SKETCH_COLUMNS[level]
    run_rank = np.argsort(np.argsort(np.array(runs, dtype=object)))
    by_series = _by_series(rows)
    pieces = []
    for series in sorted(by_series, key=lambda s: _SERIES_RANK[s]):
        parts = by_series.pop(series)
        data = {k: np.concatenate([p[k] for p in parts]) for k in columns}
        del parts
        key = _packed([run_rank[data["run"]], data[level], data["bucket"]])
        order = np.argsort(key, kind="stable")
        _, starts = first_of_runs(key[order])
        kept = order[starts]
        piece = {k: data[k][kept] for k in columns if k != "count"}
        piece["count"] = np.add.reduceat(data["count"][order], starts)
        pieces.append(piece)
    if not pieces:
        return {k: np.zeros(0, np.int64) for k in columns}
    out = {k: np.concatenate([p.pop(k) for p in pieces]) for k in columns}
    if len(runs) > 1:  # series by series, each sorted by run: now by run first, the rest kept in order
        at = np.argsort(run_rank[out["run"]], kind="stable")
        out = {k: v[at] for k, v in out.items()}
    return out


def _by_series(rows: list[Rows]) -> dict[int, list[Rows]]:
    """The sketch rows of `rows` (emptied) by series: a spill holds one series' rows (`SketchCounts`); a
    part of several is split."""
    by_series: dict[int, list[Rows]] = {}
    while rows:
        part = rows.pop()
        series = part["series"]
        if not len(series):
            continue
        if series.min() == series.max():
            by_series.setdefault(int(series[0]), []).append(part)
            continue
        for s in np.unique(series):
            by_series.setdefault(int(s), []).append({k: v[series == s] for k, v in part.items()})
    return by_series


def _packed(keys: list[np.ndarray]) -> np.ndarray:
    """One integer per row that orders the rows as `keys` do (the first key first): each key's codes
    (`dense_codes`) packed in turn, the packed key ranked anew whenever packing the next would overflow."""
    packed, span = np.zeros(len(keys[0]), dtype=np.int64), 1
    for key in keys:
        codes, _, n = dense_codes(key)
        if span * n >= 2**62:
            packed = np.unique(packed, return_inverse=True)[1].reshape(-1)
            span = int(packed.max()) + 1
        packed, span = packed * n + codes, span * n
    return packed
