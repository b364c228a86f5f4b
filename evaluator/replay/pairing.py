"""The version of each token's previous `pos` in its sequence: what AReaL's shipped pairing interpolates
with (DOMAIN.md section 2, `loglinear_shipped`, `linear_shipped`).

Within an abort-resume segment the previous token has the token's own version; at `pos` 0 it is the
prompt's -1; at the first token of a later segment it is the previous segment's version, which the
validator lists per file (`FileFacts.resumes`). So a record batch needs no other batch: a row whose
previous row is the previous `pos` of the same sequence (the usual sorted file) takes that row's
version; any other row (the first of a batch, or a file in another order) is looked up in `resumes`.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from evaluator.validate.facts import SEQUENCE_KEYS


def previous_versions(batch: pa.RecordBatch, run: np.ndarray, resumes: pl.DataFrame) -> np.ndarray:
    """`[rows]` int64: the version of the token at `pos - 1` of each row's sequence (-1 at pos 0).

    `batch` has run_id, seq_id, minibatch, pos, behave_version; `run` is an integer code per row, one
    per run_id; `resumes` (run_id, seq_id, minibatch, pos, prev_version) holds every segment start after
    the first of the batch's sequences."""
    seq, mb = (batch.column(k).to_numpy(zero_copy_only=False) for k in ("seq_id", "minibatch"))
    pos = batch.column("pos").to_numpy(zero_copy_only=False)
    version = batch.column("behave_version").to_numpy(zero_copy_only=False).astype(np.int64)
    follows = np.zeros(len(pos), dtype=bool)  # (rows,) the row before is this token's previous pos
    same_sequence = (run[1:] == run[:-1]) & (seq[1:] == seq[:-1]) & (mb[1:] == mb[:-1])
    follows[1:] = same_sequence & (pos[1:] == pos[:-1] + 1)
    prev = np.where(pos == 0, -1, version)
    prev[follows] = version[np.flatnonzero(follows) - 1]
    lookup = np.flatnonzero(~follows & (pos > 0))
    if len(lookup) and len(resumes):
        rows = _keys_frame(pa.Table.from_batches([batch.select([*SEQUENCE_KEYS, "pos"]).take(lookup)]))
        found = rows.with_row_index("row").join(resumes, on=[*SEQUENCE_KEYS, "pos"], how="inner")
        prev[lookup[found["row"].to_numpy()]] = found["prev_version"].to_numpy()
    return prev


def _keys_frame(table: pa.Table) -> pl.DataFrame:
    """`table` as a polars frame with `run_id` as plain strings (a dictionary column would join as a
    categorical, which does not join with strings)."""
    i = table.schema.get_field_index("run_id")
    return pl.from_arrow(table.set_column(i, "run_id", table.column(i).cast(pa.string())))


def resumes_frame(resumes: pa.Table) -> pl.DataFrame:
    """`FileFacts.resumes` as the frame `previous_versions` joins with."""
    return _keys_frame(resumes)
