"""Test data for the validator: a clean synthetic log and one broken variant per rule.

Every variant starts from `evaluator.trainer.synthetic.synthetic_steps`, breaks exactly one rule in a known
number of rows, and is written with `evaluator.logio` like a real log. `Broken.also` lists the rules
that the same edit breaks as a side effect (e.g. `n_minibatches = 0` also puts `minibatch` out of range).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from evaluator.logio import write_log_atomic
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps
from schemas.token_log import SCHEMA_VERSION_KEY

SPEC = SyntheticSpec(run_id="builder", tokens_per_step=1536, mean_length=24)
"""Small and fast, with staleness 0..8, abort-resume segments and proximal_t."""
FIRST_STEP, N_STEPS = 8, 6


def clean_table(spec: SyntheticSpec = SPEC, n_steps: int = N_STEPS) -> pa.Table:
    """A correct log: steps 8.. so that every staleness 0..8 occurs."""
    return synthetic_steps(spec, FIRST_STEP, n_steps)


@dataclass(frozen=True)
class Broken:
    path: Path
    rule: str
    column: str | None
    rows: int
    also: frozenset[str] = field(default_factory=frozenset)


# --- table edits ----------------------------------------------------------------------------------


def sequence_index(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sequence number per row, start row per sequence, length per sequence) of a table whose rows are
    grouped by (seq_id, minibatch) and sorted by pos within a sequence, as the synthetic logs are."""
    seq = table["seq_id"].to_numpy()
    mb = table["minibatch"].to_numpy()
    new = np.r_[True, (seq[1:] != seq[:-1]) | (mb[1:] != mb[:-1])]
    starts = np.flatnonzero(new)
    return np.cumsum(new) - 1, starts, np.diff(np.r_[starts, len(seq)])


def roll_within_sequences(table: pa.Table, column: str, shift: int) -> pa.Table:
    """`column` shifted like `torch.roll(x, shifts=shift)` inside every sequence (the alignment bug)."""
    group, starts, lengths = sequence_index(table)
    rows = np.arange(table.num_rows)
    source = starts[group] + (rows - starts[group] - shift) % lengths[group]
    return set_column(table, column, table[column].take(pa.array(source)))


def set_column(table: pa.Table, name: str, values: pa.Array | pa.ChunkedArray | np.ndarray) -> pa.Table:
    field = table.schema.field(name)
    array = values if isinstance(values, pa.Array | pa.ChunkedArray) else pa.array(values, type=field.type)
    return table.set_column(table.schema.get_field_index(name), field, array.cast(field.type))


def where(table: pa.Table, name: str, mask: np.ndarray, value: object) -> pa.Table:
    """`name` set to `value` (None for null) on the rows of `mask`."""
    column = table[name].combine_chunks()
    scalar = pa.scalar(value, type=column.type)
    return set_column(table, name, pc.if_else(pa.array(mask), scalar, column))


def _rows(table: pa.Table, every: int = 97) -> np.ndarray:
    """A deterministic scattering of rows."""
    return np.arange(table.num_rows) % every == 5


def _segments(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(row is in its sequence's last segment, sequence has several segments), per row."""
    group, starts, _ = sequence_index(table)
    bv = table["behave_version"].to_numpy()
    top = np.maximum.reduceat(bv, starts)[group]
    return bv == top, np.minimum.reduceat(bv, starts)[group] < top


def _whole_sequences(table: pa.Table, pick: np.ndarray) -> np.ndarray:
    """Rows of the sequences picked by a per-sequence mask."""
    group, _, _ = sequence_index(table)
    return pick[group]


# --- one builder per rule -------------------------------------------------------------------------


def _write(table: pa.Table, path: Path, rule: str, column: str | None, rows: int, also=()) -> Broken:
    write_log_atomic(table, path)
    return Broken(path, rule, column, rows, frozenset(also))


def _missing_column(t: pa.Table, path: Path) -> Broken:
    return _write(t.drop_columns(["theta_logp"]), path, "missing_column", "theta_logp", 0)


def _wrong_type(t: pa.Table, path: Path) -> Broken:
    table = t.set_column(
        t.schema.get_field_index("pos"), pa.field("pos", pa.int64()), t["pos"].cast(pa.int64())
    )
    return _write(table, path, "wrong_type", "pos", 0)


def _no_schema_version(t: pa.Table, path: Path) -> Broken:
    return _write(t.replace_schema_metadata({}), path, "schema_version", None, 0)


def _unknown_schema_version(t: pa.Table, path: Path) -> Broken:
    return _write(t.replace_schema_metadata({SCHEMA_VERSION_KEY: "2"}), path, "schema_version", None, 0)


def _truncated(t: pa.Table, path: Path) -> Broken:
    write_log_atomic(t, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return Broken(path, "unreadable", None, 0)


def _corrupt_data(t: pa.Table, path: Path) -> Broken:
    """A readable footer over data pages overwritten with noise (a bad disk block, a partial copy)."""
    write_log_atomic(t, path)
    data = bytearray(path.read_bytes())
    middle = len(data) // 3
    data[middle : middle + 4096] = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))
    return Broken(path, "unreadable", None, 0)


def _not_parquet(t: pa.Table, path: Path) -> Broken:
    path.write_text("run_id,step\nx,1\n")
    return Broken(path, "unreadable", None, 0)


def _null_required(t: pa.Table, path: Path) -> Broken:
    mask = _rows(t)
    return _write(where(t, "behave_logp", mask, None), path, "null_required", "behave_logp", int(mask.sum()))


def _non_finite_logp(t: pa.Table, path: Path) -> Broken:
    mask = _rows(t, 89)
    table = where(
        where(t, "prox_logp", mask & (np.arange(len(mask)) % 2 == 0), float("inf")),
        "prox_logp",
        mask & (np.arange(len(mask)) % 2 == 1),
        float("nan"),
    )
    return _write(table, path, "non_finite_logp", "prox_logp", int(mask.sum()))


def _non_finite_advantage(t: pa.Table, path: Path) -> Broken:
    """NaN advantages on every 97th token (a division by a zero group std without eps)."""
    mask = _rows(t)
    table = where(t, "advantage", mask, float("nan"))
    return _write(table, path, "non_finite_value", "advantage", int(mask.sum()))


def _positive_logp(t: pa.Table, path: Path) -> Broken:
    mask = _rows(t)
    return _write(where(t, "theta_logp", mask, 0.25), path, "positive_logp", "theta_logp", int(mask.sum()))


def _behave_version_after_step(t: pa.Table, path: Path) -> Broken:
    """`step` logged one below the newest version on every 7th sequence: its last segment looks
    generated after the step started."""
    group, starts, _ = sequence_index(t)
    picked = _whole_sequences(t, np.arange(len(starts)) % 7 == 3)
    bv = t["behave_version"].to_numpy()
    step = np.where(picked, np.maximum.reduceat(bv, starts)[group] - 1, t["step"].to_numpy())
    rows = int((bv > step).sum())
    return _write(set_column(t, "step", step), path, "behave_version_after_step", "behave_version", rows)


def _minibatch_out_of_range(t: pa.Table, path: Path) -> Broken:
    _, starts, _ = sequence_index(t)
    picked = _whole_sequences(t, np.arange(len(starts)) % 11 == 2)
    minibatch = np.where(picked, t["n_minibatches"].to_numpy(), t["minibatch"].to_numpy())
    return _write(
        set_column(t, "minibatch", minibatch), path, "minibatch_out_of_range", "minibatch", int(picked.sum())
    )


def _n_minibatches_invalid(t: pa.Table, path: Path) -> Broken:
    mask = _rows(t)
    table = where(t, "n_minibatches", mask, 0)
    return _write(
        table, path, "n_minibatches_invalid", "n_minibatches", int(mask.sum()), {"minibatch_out_of_range"}
    )


def _duplicate_row(t: pa.Table, path: Path) -> Broken:
    extra = t.filter(pa.array(_rows(t)))
    table = pa.concat_tables([t, extra]).sort_by(
        [("step", "ascending"), ("minibatch", "ascending"), ("seq_id", "ascending"), ("pos", "ascending")]
    )
    return _write(table, path, "duplicate_row", "pos", extra.num_rows)


def _pos_gap(t: pa.Table, path: Path) -> Broken:
    """Drop pos 1 of every 5th sequence of length >= 3."""
    group, starts, lengths = sequence_index(t)
    pos = t["pos"].to_numpy()
    picked = (np.arange(len(starts)) % 5 == 1) & (lengths >= 3)
    drop = picked[group] & (pos == 1)
    rows = int(lengths[picked].sum() - picked.sum())
    return _write(t.filter(pa.array(~drop)), path, "pos_gap", "pos", rows)


def _proximal_t_version(t: pa.Table, path: Path) -> Broken:
    """proximal_t_version = behave_version before the last segment (the resume prefill not recorded)."""
    last, _ = _segments(t)
    mask = ~last & (np.arange(t.num_rows) % 3 == 0)
    table = set_column(
        t,
        "proximal_t_version",
        np.where(mask, t["behave_version"].to_numpy(), t["proximal_t_version"].to_numpy()),
    )
    return _write(table, path, "proximal_t_version", "proximal_t_version", int(mask.sum()))


def _proximal_t_partial(t: pa.Table, path: Path) -> Broken:
    """proximal_t missing on pos 0 of every 4th sequence (bug 1 of seeds/000: wrong length)."""
    _, starts, _ = sequence_index(t)
    mask = np.zeros(t.num_rows, dtype=bool)
    mask[starts[::4]] = True
    table = where(where(t, "proximal_t_logp", mask, None), "proximal_t_version", mask, None)
    return _write(table, path, "proximal_t_partial", "proximal_t_logp", int(mask.sum()))


def _proximal_t_pair(t: pa.Table, path: Path) -> Broken:
    mask = _rows(t)
    return _write(
        where(t, "proximal_t_version", mask, None),
        path,
        "proximal_t_pair",
        "proximal_t_version",
        int(mask.sum()),
    )


def _version_order(t: pa.Table, path: Path) -> Broken:
    """Versions reversed along pos in every multi-segment sequence."""
    group, starts, lengths = sequence_index(t)
    _, multi = _segments(t)
    rows = np.arange(t.num_rows)
    mirrored = starts[group] + lengths[group] - 1 - (rows - starts[group])
    bv = np.where(multi, t["behave_version"].to_numpy()[mirrored], t["behave_version"].to_numpy())
    table = set_column(t, "behave_version", bv)
    return _write(
        table,
        path,
        "version_order",
        "behave_version",
        int(multi.sum()),
        {"proximal_t_version", "misaligned_version"},
    )


def _negative_version(t: pa.Table, path: Path) -> Broken:
    """The last prompt token leaked into every 6th response as its pos 0, with AReaL's prompt version -1
    (no proximal_t columns, so that no other rule sees the edit)."""
    _, starts, _ = sequence_index(t)
    mask = np.zeros(t.num_rows, dtype=bool)
    mask[starts[::6]] = True
    table = where(t.drop_columns(["proximal_t_logp", "proximal_t_version"]), "behave_version", mask, -1)
    return _write(table, path, "negative_version", "behave_version", int(mask.sum()))


def _negative_proximal_t_version(t: pa.Table, path: Path) -> Broken:
    mask = _rows(t)
    table = where(t, "proximal_t_version", mask, -1)
    return _write(
        table, path, "negative_version", "proximal_t_version", int(mask.sum()), {"proximal_t_version"}
    )


BUILDERS: dict[str, Callable[[pa.Table, Path], Broken]] = {
    "missing_column": _missing_column,
    "wrong_type": _wrong_type,
    "no_schema_version": _no_schema_version,
    "unknown_schema_version": _unknown_schema_version,
    "truncated": _truncated,
    "not_parquet": _not_parquet,
    "corrupt_data": _corrupt_data,
    "null_required": _null_required,
    "non_finite_logp": _non_finite_logp,
    "non_finite_advantage": _non_finite_advantage,
    "positive_logp": _positive_logp,
    "behave_version_after_step": _behave_version_after_step,
    "minibatch_out_of_range": _minibatch_out_of_range,
    "n_minibatches_invalid": _n_minibatches_invalid,
    "duplicate_row": _duplicate_row,
    "pos_gap": _pos_gap,
    "proximal_t_version": _proximal_t_version,
    "proximal_t_partial": _proximal_t_partial,
    "proximal_t_pair": _proximal_t_pair,
    "version_order": _version_order,
    "negative_version": _negative_version,
    "negative_proximal_t_version": _negative_proximal_t_version,
}
"""Case name -> builder of a file that breaks one rule (the case name, or two cases for one rule)."""


def build(case: str, folder: Path, table: pa.Table | None = None) -> Broken:
    """Write the broken variant `case` of `table` (default: `clean_table()`) into `folder`."""
    return BUILDERS[case](clean_table() if table is None else table, folder / f"{case}.parquet")
