"""Reading a token log for replay: record batches that hold whole sequences.

A loss that decides per sequence (GSPO, sequence-level rejection) and the per-sequence diagnostics need
every loss token of a sequence `(run_id, seq_id, minibatch)` in one batch. Batch `j` of a file is rows
`[s_j, s_(j+1))`, where `s_j` is the first row at or after `j * batch_rows` that starts a sequence (a row
whose key differs from the row before it; `s_0 = 0`): a function of the file alone, so a range of batches
read by one worker yields the very batches that reading the whole file yields there, and sums do not
depend on how a file is cut into ranges. This assumes a sequence's rows are contiguous in the file (the
hook and the importers write them so); `evaluator.replay.summarise` counts the rows that start a sequence
against the file's sequences and replays a copy sorted by sequence (`sorted_copy`) when they differ.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SEQUENCE_KEYS = ("run_id", "seq_id", "minibatch")


def _rows_from(
    parquet: pq.ParquetFile, first: int, columns: list[str], chunk: int
) -> Iterator[pa.RecordBatch]:
    """The file's rows from row `first` on, in record batches of up to `chunk` rows."""
    sizes = [parquet.metadata.row_group(i).num_rows for i in range(parquet.num_row_groups)]
    bounds = np.cumsum([0, *sizes])  # (R + 1,) first row of each row group
    group = int(np.searchsorted(bounds, first, side="right")) - 1
    skip = first - int(bounds[group])
    for batch in parquet.iter_batches(batch_size=chunk, columns=columns, row_groups=range(group, len(sizes))):
        if skip >= batch.num_rows:
            skip -= batch.num_rows
            continue
        yield batch.slice(skip)
        skip = 0


def _keys(batch: pa.RecordBatch) -> list[np.ndarray]:
    """The batch's sequence keys as arrays comparable row to row (run_id as dictionary-free values)."""
    run = batch.column("run_id")
    if pa.types.is_dictionary(run.type):
        run = run.cast(run.type.value_type)
    others = (batch.column(k).to_numpy(zero_copy_only=False) for k in SEQUENCE_KEYS[1:])
    return [run.to_numpy(zero_copy_only=False), *others]


def sequence_starts(batch: pa.RecordBatch, previous: tuple | None) -> np.ndarray:
    """`[rows]` True where a row starts a sequence: its key differs from the row before it (`previous`:
    the key of the row before the batch, None at the file's start)."""
    keys = _keys(batch)
    starts = np.zeros(batch.num_rows, dtype=bool)
    for key in keys:
        starts[1:] |= key[1:] != key[:-1]
    if batch.num_rows:
        starts[0] = previous is None or previous != tuple(k[0] for k in keys)
    return starts


def _last_key(batch: pa.RecordBatch) -> tuple:
    return tuple(k[-1] for k in _keys(batch.slice(batch.num_rows - 1)))


def iter_batches(
    path, columns: list[str], batch_rows: int, rows: tuple[int, int] | None = None
) -> Iterator[pa.RecordBatch]:
    """The file's batches of whole sequences (module docstring), those whose first row is in [start, end)
    if `rows` is given (`start` and `end` multiples of `batch_rows`, or `end` the file's length)."""
    parquet = pq.ParquetFile(path, pre_buffer=False)  # pre_buffer keeps every chunk read: 350 MiB on 20M
    n_rows = parquet.metadata.num_rows
    start, end = rows if rows is not None else (0, n_rows)
    present = set(parquet.schema_arrow.names)
    columns = [c for c in dict.fromkeys([*SEQUENCE_KEYS, *columns]) if c in present]
    first = max(start - 1, 0)  # the row before `start` says whether `start` continues a sequence
    emitting, next_cut = start == 0, start + batch_rows
    pending: list[pa.RecordBatch] = []
    previous, offset = None, first
    for batch in _rows_from(parquet, first, columns, batch_rows):
        starts = offset + np.flatnonzero(sequence_starts(batch, previous))  # (k,) global rows
        previous, begin = _last_key(batch), offset
        for cut in starts:
            if not emitting:
                if cut >= start:
                    emitting, begin = True, cut
                continue
            if cut < next_cut:
                continue
            piece = batch.slice(begin - offset, cut - begin)
            out = _joined([*pending, piece])
            pending, begin = [], cut
            if out.num_rows:
                yield out
            if cut >= end:
                return
            while next_cut <= cut:
                next_cut += batch_rows
        if emitting:
            pending.append(batch.slice(begin - offset))
        offset += batch.num_rows
    if pending and (out := _joined(pending)).num_rows:
        yield out


def _joined(pieces: list[pa.RecordBatch]) -> pa.RecordBatch:
    pieces = [p for p in pieces if p.num_rows] or pieces[:1]
    if len(pieces) == 1:
        return pieces[0]
    return pa.Table.from_batches(pieces).combine_chunks().to_batches()[0]


def sorted_copy(path, out) -> None:
    """`path` rewritten to `out` with its rows ordered by sequence and position (DuckDB sorts out of core):
    what a file whose sequences are not contiguous is replayed from."""
    from evaluator.duck import connect, literal

    with connect() as con:
        con.execute(
            f"COPY (SELECT * FROM read_parquet({literal(str(path))}) "
            f"ORDER BY run_id, seq_id, minibatch, pos) TO {literal(str(out))} (FORMAT parquet)"
        )


def footer_rows(path: Path) -> int:
    """A file's rows by its Parquet footer; 0 for one that cannot be read (validation reports it)."""
    try:
        return pq.ParquetFile(path).metadata.num_rows
    except Exception:
        return 0
