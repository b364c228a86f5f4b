"""A deterministic sample of whole blocks of responses of one file, what the findings read the shape of
responses from (`evaluator.validate.shapes`, `groups`, `segments`): every row of the chosen blocks, sorted
by run, step, seq_id, minibatch and pos, as numpy arrays, with each response's rows located.

A block is the responses of one step whose `seq_id // BLOCK` is the same: consecutive seq_ids, so a GRPO
group (the responses to one prompt, numbered consecutively by the trainers) stays whole when its size
divides BLOCK, and a response stays whole in every minibatch that records it. Blocks are chosen by a hash
of (step, seq_id // BLOCK) so that about `MAX_SAMPLE_ROWS` rows are read; a file under that size is read
whole. Only a file that broke no rule is sampled, so each response's positions are exactly 0..L-1 and
its versions rise along pos.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow.compute as pc

MAX_SAMPLE_ROWS = 300_000
"""Rows of whole blocks of responses a file hands the shape findings (a 20M-row file: 1.5%)."""
BLOCK = 128
"""Consecutive seq_ids sampled together: groups of 2, 4, 8, ... 128 stay whole."""
_HASH_BUCKETS = 1 << 16  # the hash modulo: the sampled share is buckets / this
_NUMERIC = (
    "step", "minibatch", "n_minibatches", "seq_id", "pos", "token_id", "loss_mask", "behave_logp",
    "behave_version", "prox_logp", "theta_logp", "proximal_t_logp", "proximal_t_version", "advantage",
    "reward",
)  # fmt: skip


@dataclass
class BlockSample:
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


def load_block_sample(con: duckdb.DuckDBPyConnection, usable: frozenset[str], n_rows: int) -> BlockSample:
    """The rows of the chosen blocks of the view `src` (a file that broke no rule, of `n_rows` rows)."""
    sampled = n_rows > MAX_SAMPLE_ROWS
    buckets = max(1, _HASH_BUCKETS * MAX_SAMPLE_ROWS // max(n_rows, 1))
    where = f"hash(step, seq_id // {BLOCK}) % {_HASH_BUCKETS} < {buckets}" if sampled else "TRUE"
    selected = ", ".join(f"{c}::DOUBLE AS {c}" if c in usable else f"NULL::DOUBLE AS {c}" for c in _NUMERIC)
    table = con.sql(f"""SELECT run_id, {selected} FROM src WHERE {where}
        ORDER BY run_id, step, seq_id, minibatch, pos""").to_arrow_table()
    codes = pc.dictionary_encode(table["run_id"]).combine_chunks()
    x = {c: table.column(c).to_numpy().astype(np.float64) for c in _NUMERIC}  # nulls -> NaN
    run = codes.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    key = np.stack([run, *(x[c] for c in ("step", "seq_id", "minibatch"))])  # (4, N)
    new = np.ones(len(run), dtype=bool)
    new[1:] = (key[:, 1:] != key[:, :-1]).any(axis=0)
    starts = np.flatnonzero(new)
    return BlockSample(
        run_ids=codes.dictionary.to_pylist(),
        run=run,
        x=x,
        sampled=sampled,
        resp=np.cumsum(new) - 1,
        starts=starts,
        lengths=np.diff(np.r_[starts, len(run)]),
    )
