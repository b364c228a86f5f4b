"""A group commit: the staged files of several input files (`StagedFile`) registered in one transaction,
so the fixed cost of a commit (the snapshot DuckLake writes into its catalog, the ticket) is paid once
per group, not once per file.

Every file of a group is checked against the store as committed before any of them is registered (its
digest not stored, none of its tokens stored: `evaluator.store.repeats`), then those that pass are
registered, in order; one COMMIT makes them all visible at once. Checking before registering keeps the
token check to the stored files whose seq_id range meets the file's (a file registered in the same
transaction has no column statistics in the catalog yet, so DuckLake would scan it whole). It also means
the group's files are checked against each other here, in memory: a group in which two files share a
token or an id is committed file by file instead, where the store names the earlier file (or reports
the later one as its copy) as it always does.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from evaluator.duck import arrow_view, literal
from evaluator.errors import StoreError
from evaluator.problems import Problem
from evaluator.store.evidence import evidence_rows
from evaluator.store.lake import STORE
from evaluator.store.repeats import CopyOf, repeats
from evaluator.store.staging import FileSummary, Stager, unstorable_text
from evaluator.validate.evidence import Evidence
from evaluator.validate.facts import keyed, overlaps_sql, shared_tokens

Result = bool | Problem | CopyOf
"""What an ingest of one file gives: True (committed), False (its digest is stored), a problem or a copy."""


@dataclass(frozen=True)
class StagedFile:
    """One input file whose rows are written as Parquet files of the store's tables (`staged`: {table:
    file}, `evaluator.store.staging.Stager.stage`), ready for a commit to register: what it is recorded
    as, and what the commit's checks read (its sequences; its tokens and moments, to tell a re-saved copy
    of a stored file from a duplicate)."""

    location: str
    file_id: int
    digest: str
    staged: dict[str, str]
    sequences: pa.Table
    file_tokens: pa.Table
    moments: pa.Table
    evidence: Evidence | None
    n_rows: int
    n_tokens: int
    sketch_runs: tuple[str, ...]
    sketch_rows: int

    @property
    def name(self) -> str:
        """The file's name (what a test's crash point names)."""
        return self.location.rsplit("/", 1)[-1]


def file_id_of(digest: str) -> int:
    """A file's id: the first 60 bits of its digest, the same in every store whatever the order of ingest."""
    return int(digest[:15], 16)


def staged_file(
    stager: Stager,
    location: str,
    digest: str,
    summary: FileSummary,
    sequences: pa.Table,
    evidence: Evidence | None,
) -> StagedFile | Problem:
    """One file's rows staged by `stager`, to be recorded under `location`; or the problem of a run_id
    the store cannot keep (nothing written)."""
    unstorable = unstorable_text(summary)
    if unstorable is not None:
        return unstorable
    file_id = file_id_of(digest)
    runs = tuple(pc.unique(summary.sketch_by_staleness["run_id"]).to_pylist())
    return StagedFile(
        location, file_id, digest, stager.stage(file_id, summary, sequences), sequences,
        summary.file_tokens, summary.moments, evidence, summary.n_rows, summary.n_tokens, runs,
        summary.sketch_by_staleness.num_rows,
    )  # fmt: skip


def entangled(files: list[StagedFile]) -> bool:
    """Do two files of the group share an id or a token (`(run_id, seq_id, minibatch, pos)`)?"""
    return len({f.file_id for f in files}) < len(files) or bool(shared_tokens([f.sequences for f in files]))


def check(con: duckdb.DuckDBPyConnection, files: list[StagedFile], db: str) -> list[Result | None]:
    """In the transaction `con` is in, each file against the store as committed: False if its digest is
    stored, its problem or `CopyOf` if it repeats stored tokens (`evaluator.store.repeats`), else None (the
    file may be registered). One query looks up the group's digests and one its tokens (bounded by
    constants, so DuckLake skips the stored files whose seq_id range misses the group's); a file found to
    repeat stored tokens is looked at again on its own (a copy, or which file holds them)."""
    ids = [f.file_id for f in files]
    sql = f"SELECT file_id, digest FROM ingested_file WHERE list_contains({literal(ids)}, file_id)"
    stored = dict(con.execute(sql).fetchall())
    results: list[Result | None] = []
    for f in files:
        if stored.get(f.file_id, f.digest) != f.digest:
            raise StoreError(f"{db}: two files share the id {f.file_id} ({f.digest}, {stored[f.file_id]})")
        results.append(False if f.file_id in stored else None)
    todo = [i for i, result in enumerate(results) if result is None]
    group = keyed([files[i].sequences for i in todo])
    if group is None:
        return results
    bounds = pc.min_max(group["seq_id"])
    in_range = f"e.seq_id BETWEEN {int(bounds['min'].as_py())} AND {int(bounds['max'].as_py())}"
    with arrow_view(con, "group_sequences", group):
        sql = overlaps_sql("group_sequences", "file_sequences", "l.file", "e.file_id", in_range)
        repeating = [todo[row[0]] for row in con.execute(sql).fetchall()]
    for i in repeating:
        results[i] = repeats(con, files[i].sequences, files[i].file_tokens, files[i].moments)
    return results


def register(con: duckdb.DuckDBPyConnection, files: list[StagedFile]) -> None:
    """In the transaction `con` is in: the files' rows of `ingested_file`, their staged Parquet files and
    their evidence for the findings."""
    values = ", ".join(
        f"({', '.join(literal(v) for v in (f.file_id, f.digest, f.location, f.n_rows, f.n_tokens))}, now())"
        for f in files
    )
    con.execute(f"INSERT INTO ingested_file VALUES {values}")
    for f in files:
        for table, target in f.staged.items():
            con.execute(f"CALL ducklake_add_data_files('{STORE}', '{table}', {literal(target)})")
    evidence = [evidence_rows(f.file_id, f.evidence) for f in files if f.evidence is not None]
    if evidence:
        with arrow_view(con, "part", pa.concat_tables(evidence)):
            con.execute("INSERT INTO file_evidence SELECT * FROM part")
