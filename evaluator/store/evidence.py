"""Each stored file's evidence for the findings (`evaluator.validate.evidence.Evidence`), kept generically:
one row per file and table (`file_evidence`), the table as an Arrow IPC stream. Any table `Evidence`
carries is stored and read back without a change of the store; a run's findings are judged on the
evidence of all its files added up (`evaluator.validate.evidence.pooled`)."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from evaluator.duck import literal
from evaluator.validate.evidence import KEYS, Evidence, pooled

EXAMPLES = "examples"
"""The name of the examples' row (every other row is a table of `Evidence.tables`)."""


def _ipc(table: pa.Table) -> bytes:
    """The table's rows in a fixed order (aggregates come in any order) as an Arrow IPC stream."""
    table = table.sort_by([(c, "ascending") for c in table.column_names])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def evidence_rows(file_id: int, evidence: Evidence) -> pa.Table:
    """The `file_evidence` rows of one file."""
    named = {**evidence.tables, EXAMPLES: evidence.examples}
    return pa.table(
        {
            "file_id": pa.array([file_id] * len(named), pa.int64()),
            "name": pa.array(list(named), pa.string()),
            "ipc": pa.array([_ipc(t) for t in named.values()], pa.binary()),
        }
    )


def run_evidence(con: duckdb.DuckDBPyConnection, runs: list[str]) -> tuple[Evidence | None, list[str]]:
    """The pooled evidence of those of `runs` whose every stored file carries every table of `KEYS` (files
    read in file_id order, so the sums add in the same order whatever order the files came in), and
    those runs; (None, []) when none does."""
    rows = con.execute(
        f"""WITH files AS (SELECT DISTINCT run_id, file_id FROM file_tokens
                           WHERE run_id IN (SELECT unnest({literal(runs)})))
            SELECT f.run_id, f.file_id, list(e.name ORDER BY e.name) FILTER (WHERE e.name IS NOT NULL)
            FROM files f LEFT JOIN file_evidence e USING (file_id) GROUP BY ALL ORDER BY ALL"""
    ).fetchall()
    needed = {*KEYS, EXAMPLES}
    incomplete = {run for run, _, names in rows if not needed <= set(names or ())}
    complete = sorted({run for run, _, _ in rows} - incomplete)
    if not complete:
        return None, []
    files = sorted({file_id for run, file_id, _ in rows if run in complete})
    stored = con.execute(
        f"SELECT file_id, name, ipc FROM file_evidence WHERE file_id IN (SELECT unnest({literal(files)})) "
        "ORDER BY file_id, name"
    ).fetchall()
    by_file: dict[int, dict[str, pa.Table]] = {}
    keep = pa.array(complete, pa.string())
    for file_id, name, ipc in stored:
        table = pa.ipc.open_stream(ipc).read_all()
        by_file.setdefault(file_id, {})[name] = table.filter(pc.is_in(table["run_id"], keep))
    evidences = [
        Evidence({k: t for k, t in tables.items() if k != EXAMPLES}, tables[EXAMPLES])
        for tables in by_file.values()
    ]
    return pooled(evidences), complete
