"""A deterministic sample of whole steps of one file, what the findings read the shape of responses from
(`evaluator.validate.shapes`, `groups`, `segments`): every row of the chosen steps, sorted by run, step,
seq_id, minibatch and pos, as numpy arrays, with each response's rows located.

Whole steps, because a GRPO group (the responses to one prompt) and the minibatches of a step live
within one step. Steps are taken in the order of a hash of (run, step) until about `MAX_SAMPLE_ROWS`
rows, at least one; a file under that size is read whole. Only a file that broke no rule is sampled, so
each response's positions are exactly 0..L-1 and its versions rise along pos.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

MAX_SAMPLE_ROWS = 500_000
"""Rows of whole steps a file hands the shape findings (a 20M-row file: about 1 step in 40)."""
_NUMERIC = (
    "step", "minibatch", "n_minibatches", "seq_id", "pos", "loss_mask", "behave_logp", "behave_version",
    "prox_logp", "theta_logp", "proximal_t_logp", "proximal_t_version", "advantage", "reward",
)  # fmt: skip


@dataclass
class StepSample:
    """The rows of the sampled steps. `run` codes index `run_ids`; nulls (and absent columns) are NaN."""

    run_ids: list[str]
    run: np.ndarray  # (N,) int64
    x: dict[str, np.ndarray]  # (N,) float64 each, by column name
    sampled: bool
    """True when the file has more rows than were taken."""
    resp: np.ndarray  # (N,) int64: the response (run, step, seq_id, minibatch) of each row, 0, 1, ...
    starts: np.ndarray  # (R,) first row of each response
    lengths: np.ndarray  # (R,) rows of each response

    def first(self, values: np.ndarray) -> np.ndarray:
        """Per response, the value on its first row. (R,)"""
        return values[self.starts]

    def total(self, values: np.ndarray) -> np.ndarray:
        """Per response, the sum over its rows (of a 0/1 mask or a number with zeros where left out)."""
        return np.add.reduceat(values.astype(np.float64), self.starts) if len(self.starts) else values

    def lowest(self, values: np.ndarray, where: np.ndarray) -> np.ndarray:
        """Per response, the smallest value over the rows of `where` (inf where none)."""
        return (
            np.minimum.reduceat(np.where(where, values, np.inf), self.starts) if len(self.starts) else values
        )

    def highest(self, values: np.ndarray, where: np.ndarray) -> np.ndarray:
        """Per response, the largest value over the rows of `where` (-inf where none)."""
        chosen = np.where(where, values, -np.inf)
        return np.maximum.reduceat(chosen, self.starts) if len(self.starts) else values

    def spread(self, per_response: np.ndarray) -> np.ndarray:
        """A per-response value on each of the response's rows. (N,)"""
        return per_response[self.resp]

    def next_in_response(self) -> np.ndarray:
        """True where the next row is the next position of the same response. (N,)"""
        same = np.zeros(len(self.resp), dtype=bool)
        same[:-1] = self.resp[1:] == self.resp[:-1]
        return same

    def has(self, column: str) -> bool:
        return bool(np.isfinite(self.x[column]).any())


def _chosen_steps(cells: pl.DataFrame) -> tuple[pl.DataFrame, bool]:
    """(run_id, step) of the sample, from the cells' token counts; and whether that is fewer than all."""
    steps = cells.group_by("run_id", "step").agg((pl.col("n") + pl.col("n_masked")).sum().alias("rows"))
    if steps["rows"].sum() <= MAX_SAMPLE_ROWS:
        return steps.select("run_id", "step"), False
    spread = (pl.col("step").cast(pl.UInt64) * 2654435761 % (1 << 32)).alias("order")  # Knuth's hash
    ordered = steps.with_columns(spread).sort("order", "run_id", "step")
    taken = ordered.filter(pl.col("rows").cum_sum().shift(1, fill_value=0) < MAX_SAMPLE_ROWS)
    return taken.select("run_id", "step"), True


def load_step_sample(con: duckdb.DuckDBPyConnection, usable: frozenset[str], cells: pa.Table) -> StepSample:
    """The rows of the chosen steps of the view `src` (a file that broke no rule)."""
    steps, sampled = _chosen_steps(pl.from_arrow(cells))
    where = "TRUE"
    if sampled:
        con.register("chosen_steps", steps.to_arrow())
        where = "(run_id, step) IN (SELECT (run_id, step) FROM chosen_steps)"
    selected = ", ".join(f"{c}::DOUBLE AS {c}" if c in usable else f"NULL::DOUBLE AS {c}" for c in _NUMERIC)
    try:
        table = con.sql(f"""SELECT run_id, {selected} FROM src WHERE {where}
            ORDER BY run_id, step, seq_id, minibatch, pos""").to_arrow_table()
    finally:
        if sampled:
            con.unregister("chosen_steps")
    codes = pc.dictionary_encode(table["run_id"]).combine_chunks()
    x = {c: table[c].to_numpy().astype(np.float64) for c in _NUMERIC}  # nulls -> NaN
    run = codes.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    key = np.stack([run, *(x[c] for c in ("step", "seq_id", "minibatch"))])  # (4, N)
    new = np.ones(len(run), dtype=bool)
    new[1:] = (key[:, 1:] != key[:, :-1]).any(axis=0)
    starts = np.flatnonzero(new)
    return StepSample(
        run_ids=codes.dictionary.to_pylist(),
        run=run,
        x=x,
        sampled=sampled,
        resp=np.cumsum(new) - 1,
        starts=starts,
        lengths=np.diff(np.r_[starts, len(run)]),
    )
