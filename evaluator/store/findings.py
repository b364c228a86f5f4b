"""The findings a replay stores with its runs (`run_finding`, `run_check` of schemas/store.sql): the warnings
with their evidence, and what every check made of every run."""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import pyarrow as pa

from evaluator.problems import CheckOutcome, Finding, format_example

_HELD = "run_id IN (SELECT run_id FROM file_tokens)"


def _findings_table(findings: Sequence[Finding]) -> pa.Table:
    return pa.table(
        {
            "run_id": pa.array([f.run_id for f in findings], pa.string()),
            "rule": pa.array([f.rule for f in findings], pa.string()),
            "column_name": pa.array([f.column for f in findings], pa.string()),
            "n_rows": pa.array([f.rows for f in findings], pa.int64()),
            "message": pa.array([f.text for f in findings], pa.string()),
            "figure": pa.array([f.figure for f in findings], pa.float64()),
            "threshold": pa.array([f.threshold for f in findings], pa.string()),
            "examples": pa.array(["; ".join(map(format_example, f.examples)) for f in findings], pa.string()),
            "advice": pa.array([f.advice for f in findings], pa.string()),
        }
    )


def _checks_table(checks: Sequence[CheckOutcome]) -> pa.Table:
    return pa.table(
        {
            "run_id": pa.array([c.run_id for c in checks], pa.string()),
            "check_name": pa.array([c.check for c in checks], pa.string()),
            "status": pa.array([c.status for c in checks], pa.string()),
            "why": pa.array([c.why for c in checks], pa.string()),
        }
    )


def record(
    con: duckdb.DuckDBPyConnection, findings: Sequence[Finding], checks: Sequence[CheckOutcome]
) -> bool:
    """Insert (or replace, by run and rule / run and check) the rows of the runs the store holds; True
    when anything was written."""
    statements = (
        ("found", _findings_table(findings), f"""INSERT OR REPLACE INTO run_finding
            (run_id, rule, column_name, n_rows, message, found_at, figure, threshold, examples, advice)
            SELECT run_id, rule, column_name, n_rows, message, now(), figure, threshold, examples, advice
            FROM found WHERE {_HELD}"""),
        ("outcomes", _checks_table(checks), f"""INSERT OR REPLACE INTO run_check
            SELECT run_id, check_name, status, why, now() FROM outcomes WHERE {_HELD}"""),
    )  # fmt: skip
    wrote = False
    for name, table, sql in statements:
        if not table.num_rows:
            continue
        con.register(name, table)
        try:
            con.execute(sql)
        finally:
            con.unregister(name)
        wrote = True
    return wrote
