"""Reading and writing token logs of schema v1 (Parquet), shared by the hook, the builders and the bench."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from schemas.token_log import COLUMNS_BY_NAME, arrow_schema


def token_table(columns: Mapping[str, np.ndarray | pa.Array | list]) -> pa.Table:
    """A schema v1 table from column arrays (any subset of the schema), cast to the schema's types.

    NaN in an optional float column becomes null (the hook marks "not recorded" that way).
    """
    unknown = set(columns) - set(COLUMNS_BY_NAME)
    if unknown:
        raise ValueError(f"not schema v1 columns: {sorted(unknown)}")
    schema = arrow_schema(list(columns))
    arrays = []
    for field in schema:
        values = columns[field.name]
        from_pandas = pa.types.is_floating(field.type) and not COLUMNS_BY_NAME[field.name].required
        arrays.append(pa.array(values, type=field.type, from_pandas=from_pandas))
    return pa.Table.from_arrays(arrays, schema=schema)


def readable_mode(path: str | os.PathLike) -> None:
    """Give a temporary file (mkstemp makes it 0600) the mode a plain `open` would: 0666 less the umask,
    so the published log is readable by whoever may read the folder (the dashboard, another user)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def write_log_atomic(table: pa.Table, path: str | os.PathLike, *, row_group_size: int = 1 << 20) -> Path:
    """Write `table` to `path` so that readers see the whole file or nothing: a temporary name in the
    same folder, fsync, then rename. The schema version travels in the file's key-value metadata."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as sink:
            pq.write_table(table, sink, row_group_size=row_group_size, compression="zstd")
            sink.flush()
            os.fsync(sink.fileno())
        readable_mode(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def file_runs(path: str | os.PathLike, limit: int) -> tuple[str, ...]:
    """Up to `limit` distinct `run_id`s of the token log at `path`: from its footer's statistics when every
    row group holds one run (the hook writes one run per file), else read from the column a record batch
    at a time. Empty for a file without a readable `run_id` (validation says why)."""
    try:
        parquet = pq.ParquetFile(path)
        meta = parquet.metadata
        index = [meta.schema.column(j).path for j in range(meta.num_columns)].index("run_id")
        runs: set[str] = set()
        for group in range(meta.num_row_groups):
            stats = meta.row_group(group).column(index).statistics
            if stats is None or not stats.has_min_max or stats.min != stats.max:
                break
            runs.add(str(stats.min))
        else:
            return tuple(sorted(runs))[:limit]
        runs = set()
        for batch in parquet.iter_batches(columns=["run_id"]):
            runs.update(map(str, pc.unique(batch.column(0)).drop_null().to_pylist()))
            if len(runs) >= limit:
                break
    except Exception:  # pyarrow raises several types for a file that is not a token log
        return ()
    return tuple(sorted(runs))[:limit]
