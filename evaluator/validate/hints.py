"""What a file that is no token log of schema v1 needs, said where it is refused: where the format is
described (`docs/token-log.md`), and the line of pyarrow that fixes a wide column or a missing schema
version, so a user's own writer is one line away from a log proxaudit reads."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from schemas.token_log import SCHEMA_VERSION, SCHEMA_VERSION_KEY, type_name

TOKEN_LOG_DOCS = (
    "proxaudit reads token logs: Parquet files of schema v1 (docs/token-log.md: the columns, their types "
    "and the lines of pyarrow that write one)"
)
PARQUET_MAGIC = b"PAR1"
ADD_SCHEMA_VERSION = (
    f"write the table with it: `table = table.replace_schema_metadata({{**(table.schema.metadata or {{}}), "
    f'b"{SCHEMA_VERSION_KEY}": b"{SCHEMA_VERSION}"}})` before `pq.write_table(table, path)` '
    "(docs/token-log.md)"
)


def unreadable(path: Path, error: Exception) -> str:
    """Why a file does not open as Parquet: cut short (it starts as Parquet does), or another format."""
    try:
        with open(path, "rb") as head:
            parquet = head.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC
    except OSError as cause:
        return f"cannot read it: {cause}"
    if parquet:
        return f"cannot open as Parquet (truncated or corrupt?): {error}"
    kind = " (a CSV file)" if path.suffix.lower() in (".csv", ".tsv") else ""
    return f"not a Parquet file{kind}: {TOKEN_LOG_DOCS}"


def cast_hint(name: str, found: pa.DataType, expected: pa.DataType) -> str:
    """The line of pyarrow that casts a column of numbers to its schema type (float64 log-probs, int64
    versions), or nothing for a column of another kind (a string `step` is no cast away)."""
    numeric = (pa.types.is_integer, pa.types.is_floating)
    if not any(test(found) and test(expected) for test in numeric):
        return ""
    return (
        f'; cast it before writing: `table = table.set_column(table.schema.get_field_index("{name}"), '
        f'"{name}", table["{name}"].cast("{type_name(expected)}"))`'
    )
