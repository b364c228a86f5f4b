"""`proxaudit summary`: read the public views of the metrics store and render them."""

from __future__ import annotations

import csv
import io
import json
import math
import os

import pyarrow as pa

from evaluator.errors import UsageError
from evaluator.store import open_store
from evaluator.text_table import aligned_lines
from schemas.store import METHODS, METRICS

VIEW_BY = {
    "run": "run_summary",
    "staleness": "staleness_summary",
    "step": "step_summary",
    "pairing": "pairing_summary",
}
ORDER_BY = {"pairing": ["run_id", "interpolation"]}
FORMATS = ("table", "json", "csv")
PAIRING_NOTE = (
    "shipped_over_own: how much AReaL's shipped version pairing (each token interpolated with the previous "
    "token's version) changes the mean abs_error on this run. AReaL's own logged loglinear/* and linear/* "
    "metrics match loglinear_shipped and linear_shipped, not loglinear and linear."
)


def summary_table(
    db_path: str | os.PathLike,
    *,
    by: str = "run",
    run: str | None = None,
    method: str | None = None,
    metric: str | None = None,
) -> pa.Table:
    """Rows of `run_summary`, `staleness_summary`, `step_summary` or `pairing_summary`, filtered and sorted.

    A missing database is a `StoreError`; an unknown run, method or metric is a `UsageError`."""
    if by not in VIEW_BY:
        raise UsageError(f"--by must be one of {', '.join(VIEW_BY)}, not {by!r}")
    for name, value, known in (("method", method, METHODS), ("metric", metric, METRICS)):
        if value is not None and value not in known:
            raise UsageError(f"unknown {name} {value!r}; known: {', '.join(known)}")
        if value is not None and by in ORDER_BY:
            raise UsageError(f"--by {by} has no {name} column: leave out --{name}")
    filters = {"run_id": run, "method": method, "metric": metric}
    where = [f"{column} = ?" for column, value in filters.items() if value is not None]
    params = [value for value in filters.values() if value is not None]
    view = VIEW_BY[by]
    order = ORDER_BY.get(by, ["run_id", *([by] if by != "run" else []), "method", "metric"])
    sql = (
        f"SELECT * FROM {view} {'WHERE ' + ' AND '.join(where) if where else ''} ORDER BY {', '.join(order)}"
    )
    with open_store(db_path) as con:
        if (
            run is not None
            and not con.execute("SELECT 1 FROM run_summary WHERE run_id = ?", [run]).fetchall()
        ):
            runs = [
                r[0] for r in con.execute("SELECT DISTINCT run_id FROM run_summary ORDER BY 1").fetchall()
            ]
            raise UsageError(f"no run {run!r} in {db_path}; runs: {', '.join(runs) or 'none'}")
        return con.sql(sql, params=params).to_arrow_table()


def _cell(value: object) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    return str(value)


def render(table: pa.Table, fmt: str = "table") -> str:
    """The rows as an aligned text table, JSON (a list of objects) or CSV."""
    rows = table.to_pylist()
    if fmt == "json":
        return json.dumps(rows, indent=1)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=table.column_names, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue().rstrip("\n")
    if fmt != "table":
        raise UsageError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    cells = [table.column_names] + [[_cell(r[c]) for c in table.column_names] for r in rows]
    types = table.schema.types
    numeric = {i for i, t in enumerate(types) if pa.types.is_integer(t) or pa.types.is_floating(t)}
    return "\n".join(aligned_lines(cells, right=numeric))
