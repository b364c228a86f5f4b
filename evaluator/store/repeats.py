"""A file that repeats stored tokens (each token counted once: `(run_id, seq_id, minibatch, pos)`): refused,
naming the stored file that holds them first, unless it is one stored file saved again with other bytes
(another codec, another writer): the same tokens with the same values. That is a copy, reported as such.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import pyarrow as pa

from evaluator.duck import arrow_view, literal
from evaluator.problems import Problem
from evaluator.validate.facts import duplicate_message, overlaps_sql

SUM_TOLERANCE = 1e-9
"""Sums of a re-saved copy's metrics may differ in their last bits (other row groups add in another
order): they agree to this share of sqrt(n * sum of squares) >= the sum of the absolute values. A second
training under the same run_id differs in every cell by far more."""


@dataclass(frozen=True)
class CopyOf:
    """A file whose tokens and values are those of one stored file, recorded under `path`."""

    path: str


def repeats(
    con: duckdb.DuckDBPyConnection, sequences: pa.Table, file_tokens: pa.Table, moments: pa.Table
) -> Problem | CopyOf | None:
    """For a file being ingested (its sequences, its summary's `file_tokens` and `moments`), in the
    transaction `con` is in: None when it repeats no stored token; `CopyOf` the stored file when it holds
    exactly that one file's tokens with the same summaries; else the `duplicate_across_files` problem
    naming the first file that holds them."""
    with arrow_view(con, "ingest_sequences", sequences):  # read more than once: a table of the transaction
        con.execute("CREATE OR REPLACE TEMP TABLE part_sequences AS FROM ingest_sequences")
    found = _repeats(con, file_tokens, moments)
    con.execute("DROP TABLE part_sequences")
    return found


def _repeats(
    con: duckdb.DuckDBPyConnection, file_tokens: pa.Table, moments: pa.Table
) -> Problem | CopyOf | None:
    """`repeats`, the file's sequences in the table `part_sequences`."""
    low, high = con.execute("SELECT min(seq_id), max(seq_id) FROM part_sequences").fetchall()[0]
    if low is None:
        return None
    # constants, not subqueries: DuckLake then skips every stored file whose seq_id range (in the catalog's
    # column statistics) misses this file's, so the check costs the overlapping files, not the run's
    in_range = f"e.seq_id BETWEEN {int(low)} AND {int(high)}"
    rows = con.execute(
        overlaps_sql("part_sequences", "file_sequences", "0", "e.file_id", in_range)
    ).fetchall()
    if not rows:
        return None
    ((_, holder, others, n_rows, n_seqs, example),) = rows
    ((path,),) = con.execute(f"SELECT path FROM ingested_file WHERE file_id = {literal(holder)}").fetchall()
    if others == 0 and _same_file(con, holder, file_tokens, moments):
        return CopyOf(path)
    message = duplicate_message(n_rows, n_seqs, path, example, others)
    return Problem("duplicate_across_files", "seq_id", n_rows, message)


_DIFFERENT_SEQUENCES = """
    SELECT count(*) FROM (
        (SELECT run_id, seq_id, minibatch, pos_min, pos_max FROM part_sequences
         EXCEPT ALL
         SELECT run_id, seq_id, minibatch, pos_min, pos_max FROM file_sequences WHERE file_id = {f})
        UNION ALL
        (SELECT run_id, seq_id, minibatch, pos_min, pos_max FROM file_sequences WHERE file_id = {f}
         EXCEPT ALL SELECT run_id, seq_id, minibatch, pos_min, pos_max FROM part_sequences))"""
_DIFFERENT_TOKENS = """
    WITH part AS (SELECT run_id, step, staleness, sum(n_tokens) AS n_tokens, sum(n_prox) AS n_prox
                  FROM part_tokens GROUP BY ALL)
    SELECT count(*) FROM part p FULL JOIN (SELECT * FROM file_tokens WHERE file_id = {f}) s
        USING (run_id, step, staleness)
    WHERE p.n_tokens IS DISTINCT FROM s.n_tokens OR p.n_prox IS DISTINCT FROM s.n_prox"""
_DIFFERENT_MOMENTS = """
    WITH part AS (SELECT run_id, step, staleness, method, metric, sum(n) AS n, sum(sum) AS sum,
                         sum(sum_sq) AS sum_sq, min(min) AS min, max(max) AS max
                  FROM part_moments GROUP BY ALL)
    SELECT count(*) FROM part p FULL JOIN (SELECT * FROM metric_moments WHERE file_id = {f}) s
        USING (run_id, step, staleness, method, metric)
    WHERE p.n IS DISTINCT FROM s.n OR p.min IS DISTINCT FROM s.min OR p.max IS DISTINCT FROM s.max
       OR NOT abs(p.sum - s.sum) <= {tol} * sqrt(s.n * greatest(p.sum_sq, s.sum_sq))
       OR NOT abs(p.sum_sq - s.sum_sq) <= {tol} * greatest(p.sum_sq, s.sum_sq)"""


def _count(con: duckdb.DuckDBPyConnection, sql: str, **values: object) -> int:
    """The count a query of one row and column gives (`sql` with `values` as literals), fetched whole (a
    transaction goes on after it)."""
    return con.execute(sql.format(**{k: literal(v) for k, v in values.items()})).fetchall()[0][0]


def _same_file(
    con: duckdb.DuckDBPyConnection, file_id: int, file_tokens: pa.Table, moments: pa.Table
) -> bool:
    """The stored file holds exactly the file's sequences (`part_sequences`), the same tokens per (run,
    step, staleness) and every metric's moments (n, min and max exactly, the sums to `SUM_TOLERANCE`)."""
    if _count(con, _DIFFERENT_SEQUENCES, f=file_id):
        return False
    with arrow_view(con, "part_tokens", file_tokens):
        if _count(con, _DIFFERENT_TOKENS, f=file_id):
            return False
    with arrow_view(con, "part_moments", moments):
        return not _count(con, _DIFFERENT_MOMENTS, f=file_id, tol=SUM_TOLERANCE)
