"""Reading and writing token logs of schema v1 (Parquet), shared by the hook, the builders and the bench."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
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
