"""What the validator learns about a clean file's tokens that later stages need, and the one rule that
needs several files at once: each token counted once (DOMAIN.md section 6).

A token is identified by `(run_id, seq_id, minibatch, pos)`. Positions of a sequence are contiguous in a
file (the `pos_gap` rule), so a file's identity data is one row per sequence with its `pos` range:
`sequences`. `resumes` holds the first token of every later abort-resume segment with the version of the
token before it, which AReaL's shipped version pairing needs (`evaluator.replay.pairing`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from evaluator.duck import arrow_view, connect
from evaluator.problems import Problem

SEQUENCE_KEYS = ("run_id", "seq_id", "minibatch")


@dataclass
class FileFacts:
    """Facts about a file that broke no rule, as small Arrow tables."""

    sequences: pa.Table
    """run_id, seq_id, minibatch, pos_min, pos_max: one row per sequence (its tokens' identity)."""
    resumes: pa.Table
    """run_id, seq_id, minibatch, pos, prev_version: the first token of each segment after the first."""


def duplicate_message(n_rows: int, n_seqs: int, holder: str, example: dict, others: int = 0) -> str:
    """The `duplicate_across_files` message: how many tokens, the file that holds them first, an example."""
    also = f" (and {others} more file{'s' if others != 1 else ''})" if others else ""
    return (
        f"{n_rows:,} tokens in {n_seqs:,} sequences repeat tokens already in {holder}{also}, e.g. run_id "
        f"{example['run_id']} seq_id {example['seq_id']} minibatch {example['minibatch']}: a token "
        "(run_id, seq_id, minibatch, pos) is counted once (the same log saved twice, two ranks writing "
        "the same sequences, or a second training under the same run_id)"
    )


def overlaps_sql(later: str, earlier: str, later_file: str, holder: str, where: str = "TRUE") -> str:
    """Per file of `later`: the earliest file of `earlier` sharing a token with it (`holder`), how many
    other files share tokens, the shared tokens and sequences, and an example key. `later` and `earlier`
    are relations of sequences (run_id, seq_id, minibatch, pos_min, pos_max) with a file column each
    (`later_file`, `holder`: SQL on the aliases `l` and `e`)."""
    keys = " AND ".join(f"l.{k} = e.{k}" for k in SEQUENCE_KEYS)
    return f"""
        WITH pairs AS (
            SELECT {later_file} AS file, {holder} AS holder, l.run_id, l.seq_id, l.minibatch,
                   least(e.pos_max, l.pos_max) - greatest(e.pos_min, l.pos_min) + 1 AS n_tokens
            FROM {later} l JOIN {earlier} e
              ON {keys} AND e.pos_min <= l.pos_max AND l.pos_min <= e.pos_max
            WHERE {where}
        ), per_seq AS (  -- a sequence repeated by several earlier files counts once
            SELECT file, run_id, seq_id, minibatch, min(holder) AS holder, max(n_tokens) AS n_tokens
            FROM pairs GROUP BY ALL
        )
        SELECT file, min(holder), count(DISTINCT holder) - 1, sum(n_tokens)::BIGINT, count(*),
               arg_min({{'run_id': run_id, 'seq_id': seq_id, 'minibatch': minibatch}},
                       (holder, run_id, seq_id))
        FROM per_seq GROUP BY file ORDER BY file"""


def keyed(sequences: list[pa.Table]) -> pa.Table | None:
    """Tables of sequences in one, each row with the index of its table (`file`); None if all are empty."""
    parts = [
        table.select(list(SEQUENCE_KEYS) + ["pos_min", "pos_max"]).append_column(
            "file", pa.array([i] * table.num_rows, pa.int32())
        )
        for i, table in enumerate(sequences)
        if table.num_rows
    ]
    return pa.concat_tables(parts, promote_options="permissive") if parts else None


def shared_tokens(sequences: list[pa.Table]) -> list[tuple]:
    """`overlaps_sql`'s rows over tables of sequences (in order): one per table that repeats a token of an
    earlier one, its index first."""
    if sum(table.num_rows > 0 for table in sequences) < 2:
        return []
    with connect() as con:
        with arrow_view(con, "sequences", keyed(sequences)):  # read twice: a table
            con.execute("CREATE TABLE keyed AS FROM sequences")
        return con.execute(overlaps_sql("keyed", "keyed", "l.file", "e.file", "e.file < l.file")).fetchall()


def cross_file_duplicates(files: list[tuple[Path, FileFacts]]) -> dict[int, Problem]:
    """`duplicate_across_files` problems of the files (in order) that repeat tokens of an earlier one,
    keyed by the index of the later file; the earliest file holding them is named."""
    rows = shared_tokens([facts.sequences for _, facts in files])
    return {
        file: Problem(
            "duplicate_across_files",
            "seq_id",
            n_rows,
            duplicate_message(n_rows, n_seqs, str(files[holder][0]), example, others),
        )
        for file, holder, others, n_rows, n_seqs, example in rows
    }
