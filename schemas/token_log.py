"""Token log format, schema v1 (DOMAIN.md section 6): one row per response token, already aligned.

This is the single definition that the hook, the validator and the docs use.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

SCHEMA_VERSION = "1"
SCHEMA_VERSION_KEY = "proxaudit.schema_version"
SUPPORTED_SCHEMA_VERSIONS = frozenset({SCHEMA_VERSION})
RUN_ID_MAX_BYTES = 200
"""The longest `run_id` (UTF-8 bytes). The store repeats a run's id on every row of its summaries (tens of
thousands of rows per step), so an id of 20,000 characters made replay of a 576-row file peak at 4.3 GB;
200 bytes also keeps the hook's file names (`{run_id}-step...parquet`) under 255 bytes."""


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    required: bool
    meaning: str


COLUMNS: tuple[Column, ...] = (
    Column("run_id", pa.string(), True, f"run name, at most {RUN_ID_MAX_BYTES} bytes (UTF-8)"),
    Column("step", pa.int64(), True, "trainer step; the trainer starts it from weights of version `step`"),
    Column("minibatch", pa.int32(), True, "PPO minibatch index within the step, 0-based"),
    Column("n_minibatches", pa.int32(), True, "minibatches in the step (>= 1)"),
    Column("seq_id", pa.int64(), True, "sequence id, unique within the run"),
    Column("pos", pa.int32(), True, "0-based index of the token in its response"),
    Column("token_id", pa.int32(), False, "token id"),
    Column("loss_mask", pa.bool_(), True, "token counts in the loss"),
    Column("behave_logp", pa.float32(), True, "log pi_behave of the token, from the inference engine"),
    Column("behave_version", pa.int32(), True, "version that generated the token"),
    Column(
        "prox_logp", pa.float32(), False, "ground truth log pi_prox (recompute); null where not recomputed"
    ),
    Column("theta_logp", pa.float32(), True, "log pi_theta at this minibatch"),
    Column("proximal_t_logp", pa.float32(), False, "segment-wise proximal_t"),
    Column("proximal_t_version", pa.int32(), False, "version under which `proximal_t_logp` was computed"),
    Column("advantage", pa.float32(), False, "advantage used by the loss"),
    Column("reward", pa.float32(), False, "sequence reward, repeated on each of its tokens"),
)

VERSIONS_KEY = b"proxaudit.versions"
"""Optional key-value metadata (schema v1, minor addition): how `behave_version` was obtained. Absent or
`recorded`: the trainer recorded it. `assumed_on_policy`: an importer's dump had no versions and wrote
`behave_version = step` (every token at staleness 0); the drift it shows is the whole behave -> prox gap."""
ASSUMED_ON_POLICY = b"assumed_on_policy"
RECORDED = b"recorded"
SOURCE_KEY = b"proxaudit.source"
"""Optional key-value metadata: where an imported file came from (`format:file`)."""

COLUMNS_BY_NAME: dict[str, Column] = {c.name: c for c in COLUMNS}
REQUIRED_COLUMNS: tuple[str, ...] = tuple(c.name for c in COLUMNS if c.required)
LOGP_COLUMNS: tuple[str, ...] = ("behave_logp", "prox_logp", "theta_logp", "proximal_t_logp")
VERSION_COLUMNS: tuple[str, ...] = ("behave_version", "proximal_t_version")


def arrow_schema(columns: list[str] | None = None) -> pa.Schema:
    """The Arrow schema of schema v1 (all columns, or the named ones in table order), with version metadata.

    Every column is nullable in Arrow terms; the validator enforces which ones must be present and filled.
    """
    chosen = COLUMNS if columns is None else tuple(c for c in COLUMNS if c.name in set(columns))
    unknown = set(columns or ()) - set(COLUMNS_BY_NAME)
    if unknown:
        raise ValueError(f"not schema v1 columns: {sorted(unknown)}")
    return pa.schema(
        [pa.field(c.name, c.type) for c in chosen], metadata={SCHEMA_VERSION_KEY: SCHEMA_VERSION}
    )


def type_name(dtype: pa.DataType) -> str:
    """The name DOMAIN.md uses for an Arrow type (Arrow says `float`/`double` for float32/float64)."""
    return {"float": "float32", "double": "float64", "halffloat": "float16"}.get(str(dtype), str(dtype))


def markdown_table() -> str:
    """The schema as the Markdown table used in DOMAIN.md and the README."""
    lines = ["| column | type | required | meaning |", "| --- | --- | --- | --- |"]
    for c in COLUMNS:
        lines.append(f"| `{c.name}` | {type_name(c.type)} | {'yes' if c.required else 'no'} | {c.meaning} |")
    return "\n".join(lines)
