"""The findings a store keeps with its runs (`run_finding`, `run_check` of schemas/store.sql) as Arrow
tables: the warnings with their evidence, and what every check made of every run
(`evaluator.store.derived` writes them)."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from evaluator.problems import CheckOutcome, Finding, format_example


def findings_table(findings: Sequence[Finding]) -> pa.Table:
    """`run_finding` rows but `found_at`."""
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


def checks_table(checks: Sequence[CheckOutcome]) -> pa.Table:
    """`run_check` rows but `checked_at`."""
    return pa.table(
        {
            "run_id": pa.array([c.run_id for c in checks], pa.string()),
            "check_name": pa.array([c.check for c in checks], pa.string()),
            "status": pa.array([c.status for c in checks], pa.string()),
            "why": pa.array([c.why for c in checks], pa.string()),
        }
    )
