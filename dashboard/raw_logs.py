"""The token inspector's raw logs: a Parquet file recorded at replay is read only where replay read it and
only while it holds the bytes recorded then (a local path hashed again when it changes, an object-storage
URI through a verified local copy), so a crafted store cannot make the dashboard read any other file.

What a store records is data: a path is used only when it is absolute, a regular file, a Parquet file with
the recorded row count and then the recorded digest; a URI only in the form replay records
(`evaluator.sources.object_path`: no options, credentials, host or port), read with the environment's
endpoint and credentials; neither ever becomes SQL text (the files are registered as an Arrow dataset)."""

from __future__ import annotations

import functools
import stat
import tempfile
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from evaluator.duck import connect
from evaluator.errors import StoreError
from evaluator.sources import DIGEST, is_uri, parquet_rows, verified_copy
from evaluator.store import file_digest
from schemas.token_log import COLUMNS

# Token log columns the inspector shows (the keys run_id, step, seq_id select); optional ones may be absent.
INSPECTOR_COLUMNS = tuple(
    c.name for c in COLUMNS if c.name not in ("run_id", "step", "seq_id", "advantage", "reward")
)

_DIGESTS: dict[tuple[str, int, int, int], str | None] = {}


@functools.cache
def _copies() -> Path:
    """This process's own folder of verified local copies of the object-storage logs the inspector reads."""
    return Path(tempfile.mkdtemp(prefix="proxaudit-inspector-"))


def readable_copy(path: str, digest: str, n_rows: int) -> str | None:
    """Where to read the file recorded as `path` at replay, only while it holds the bytes recorded then
    (`n_rows` in its Parquet footer, then its BLAKE2b `digest`): the path itself (checked once per path,
    size and mtime), or for an object-storage URI a verified local copy
    (`evaluator.sources.verified_copy`); None when it is gone, changed, or not a path replay records."""
    if is_uri(path):
        copy = verified_copy(path, digest, n_rows, _copies())
        return None if copy is None else str(copy)
    local = Path(path)
    if "\x00" in path or not local.is_absolute() or not DIGEST.fullmatch(digest):
        return None
    try:
        info = local.stat()
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    key = (path, info.st_size, info.st_mtime_ns, n_rows)
    if key not in _DIGESTS:
        _DIGESTS[key] = file_digest(path) if parquet_rows(path) == n_rows else None
    return path if _DIGESTS[key] == digest else None


def columns_of(paths: list[str]) -> set[str]:
    """The union of the columns of the raw logs at `paths` (local, verified)."""
    try:
        return set().union(*(pq.read_schema(p).names for p in paths))
    except (OSError, pa.ArrowException) as error:
        raise StoreError(f"cannot read the raw token log: {error}") from error


def raw_frame(paths: list[str], sql: str, params: list) -> pd.DataFrame:
    """Run `sql` over `raw` = the union (by column name) of the raw token logs in `paths`, registered as
    one Arrow dataset (a path never becomes SQL text, nor a pattern DuckDB would expand)."""
    import pyarrow.dataset as ds  # here only: the inspector's page

    try:
        schema = pa.unify_schemas([pq.read_schema(p) for p in paths], promote_options="permissive")
        with connect() as con:
            con.register("raw", ds.dataset(paths, schema=schema, format="parquet"))
            return con.execute(sql, params).df()
    except (duckdb.Error, OSError, pa.ArrowException) as error:
        raise StoreError(f"cannot read the raw token log {paths}: {error}") from error


def sequences(paths: list[str], run_id: str, step: int, limit: int = 500) -> pd.DataFrame:
    """The sequences of `run_id` at `step` in the raw token logs: tokens, version segments (distinct
    `behave_version` values), staleness range and tokens with `prox_logp`. Resumed sequences (more than
    one segment) come first. Empty when no raw log is reachable (`paths` empty)."""
    if not paths:
        return pd.DataFrame(
            columns=["seq_id", "n_tokens", "n_segments", "min_staleness", "max_staleness", "n_prox"]
        )
    n_prox = "count(prox_logp)" if "prox_logp" in columns_of(paths) else "0"
    return raw_frame(
        paths,
        f"""SELECT seq_id, count(*)::BIGINT AS n_tokens, count(DISTINCT behave_version)::BIGINT AS n_segments,
                   min(step - behave_version) AS min_staleness, max(step - behave_version) AS max_staleness,
                   {n_prox}::BIGINT AS n_prox
            FROM raw WHERE run_id = ? AND step = ?
            GROUP BY seq_id ORDER BY n_segments DESC, seq_id LIMIT ?""",
        [run_id, step, limit],
    )


def sequence_tokens(paths: list[str], run_id: str, step: int, seq_id: int) -> pd.DataFrame:
    """Every token of one sequence from the raw token logs, by `pos`: each policy's log-prob, the
    versions and `staleness`. Optional columns the logs lack come back as nulls."""
    if not paths:
        return pd.DataFrame(columns=[*INSPECTOR_COLUMNS, "staleness"])
    columns = columns_of(paths)
    select = ", ".join(c if c in columns else f"NULL AS {c}" for c in INSPECTOR_COLUMNS)
    return raw_frame(
        paths,
        f"""SELECT {select}, step - behave_version AS staleness FROM raw
            WHERE run_id = ? AND step = ? AND seq_id = ? ORDER BY pos""",
        [run_id, step, seq_id],
    )
