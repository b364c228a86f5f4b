"""What the store judges on a whole run, computed from its stored per-file rows: the findings and every
check's outcome (`run_finding`, `run_check`: from the evidence of all the run's files, added up) and the
95% intervals (`decision_interval`, `mean_interval`: from the per-step sums of all its files).

The staleness sketches of a run of several files are merged over files here too (and by a writer whenever
the rows it added outnumber the merged ones), so run-level quantiles read one sketch per run. These rows
depend on the set of stored files alone, never on which replay ingested which file: `run_state` records the
files (their number and the xor of their ids) and the maximum staleness each run's rows were
computed from, and a writer recomputes every run whose files differ (`refresh`, at the end of a replay),
in one transaction. So partial, killed, resumed and concurrent replays end in the rows one clean replay
of the same files writes.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa

from evaluator.duck import arrow_view, literal, on_one_thread
from evaluator.store.evidence import run_evidence
from evaluator.store.findings import checks_table, findings_table
from evaluator.store.intervals import interval_tables
from evaluator.validate.findings import run_findings

NO_MAX = -1
"""`run_state.max_staleness` when the findings were judged without a maximum staleness."""
_STALE = """
    WITH files AS (SELECT DISTINCT run_id, file_id FROM file_tokens),
    now AS (SELECT run_id, count(*) AS n_files, bit_xor(file_id) AS files_xor FROM files GROUP BY run_id)
    SELECT now.run_id FROM now LEFT JOIN run_state s USING (run_id)
    WHERE s.run_id IS NULL OR s.n_files != now.n_files OR s.files_xor != now.files_xor
       OR s.max_staleness != {max} ORDER BY 1"""
_OF_FILES = """
    SELECT run_id FROM sketch_by_staleness WHERE {all} OR run_id IN (SELECT unnest({runs})) GROUP BY run_id
    HAVING count(DISTINCT file_id) > 1
       AND (NOT {grown} OR count(*) FILTER (file_id != 0) >= count(*) FILTER (file_id = 0)) ORDER BY 1"""
_STATE = """
    SELECT run_id, count(*) AS n_files, bit_xor(file_id) AS files_xor, {max}::INTEGER AS max_staleness
    FROM (SELECT DISTINCT run_id, file_id FROM file_tokens WHERE run_id IN (SELECT unnest({runs})))
    GROUP BY run_id ORDER BY run_id"""


_SERIES = """
    SELECT DISTINCT run_id, method FROM sketch_by_staleness WHERE run_id IN (SELECT unnest({runs}))
    ORDER BY ALL"""
_MERGED = """
    SELECT staleness, metric, bucket, sum(count)::BIGINT AS count
    FROM sketch_by_staleness WHERE run_id = {run} AND method = {method} GROUP BY ALL
    ORDER BY metric, staleness, bucket"""
"""One method's merged rows; taken in the order of (`run_id`, `method`), the rows come in the order a
file's rows are staged (`evaluator.store.staging`)."""
_INSERT_MERGED = """
    INSERT INTO sketch_by_staleness SELECT 0, run_id::VARCHAR, staleness, method::VARCHAR, metric::VARCHAR,
    bucket, count FROM merged_sketch"""


def mergeable(
    con: duckdb.DuckDBPyConnection, runs: list[str] | None = None, grown: bool = False
) -> list[str]:
    """Those of `runs` (default: every run) whose staleness sketch rows come from more than one file (file
    0: merged rows); with `grown`, only those whose rows not merged yet are at least as many as the merged
    ones (a run's merged sketch is then rewritten each time it doubles, not after every file). A run of one
    file is not merged: its rows are its sketch already, and whether a run's rows are merged then depends
    on its set of files alone, never on the replays that stored them."""
    sql = _OF_FILES.format(all=literal(runs is None), runs=literal(runs or []), grown=literal(grown))
    rows = con.execute(sql).fetchall()
    return [run for (run,) in rows]


def merge_sketches(con: duckdb.DuckDBPyConnection, runs: list[str]) -> int:
    """Merge the staleness sketches of `runs` (`mergeable` ones) over their files into one row per bucket
    (file_id 0; counts add exactly, so merging in any order and as often as one likes gives the same rows),
    inside the caller's transaction: run-level quantiles then read a run's sketch, not one per file. The
    rows left. Each run's methods are added up one at a time, their rows kept in Arrow with their strings as
    codes: the merge then holds one method's hash table and the merged rows (a late file of watch's
    benchmark on the 330-file store: 848 -> 591 MB at most in a process of its own; a whole-run GROUP BY held
    every bucket of the run's files at once). The rows go in as one insert, on one thread: on two, DuckLake
    writes an Arrow stream's rows out of their order."""
    series = con.execute(_SERIES.format(runs=literal(runs))).fetchall()
    rows = pa.concat_tables([_merged(con, run, method) for run, method in series])
    con.execute(f"DELETE FROM sketch_by_staleness WHERE run_id IN (SELECT unnest({literal(runs)}))")
    with arrow_view(con, "merged_sketch", rows), on_one_thread(con):
        con.execute(_INSERT_MERGED)
    return rows.num_rows


def _merged(con: duckdb.DuckDBPyConnection, run: str, method: str) -> pa.Table:
    """One method's merged sketch rows with their strings as dictionary codes: what a merge holds until it
    inserts them takes about 30 bytes a row, not the 100 of a DuckDB table's."""
    part = con.execute(_MERGED.format(run=literal(run), method=literal(method))).to_arrow_table()
    zeros = pa.array(np.zeros(part.num_rows, np.int32))
    return pa.table(
        {
            "run_id": pa.DictionaryArray.from_arrays(zeros, pa.array([run])),
            "staleness": part["staleness"],
            "method": pa.DictionaryArray.from_arrays(zeros, pa.array([method])),
            "metric": part["metric"].dictionary_encode(),
            "bucket": part["bucket"],
            "count": part["count"],
        }
    )


def stale_runs(con: duckdb.DuckDBPyConnection, max_staleness: int | None) -> list[str]:
    """The runs whose derived rows were computed from other files (or another maximum staleness)."""
    limit = NO_MAX if max_staleness is None else int(max_staleness)
    return [run for (run,) in con.execute(_STALE.format(max=literal(limit))).fetchall()]


def refresh(con: duckdb.DuckDBPyConnection, max_staleness: int | None, merge: bool = True) -> list[str]:
    """Recompute the derived rows of every stale run, and (with `merge`) merge the staleness sketches of
    every run whose rows come from more than one file, inside the caller's transaction; the runs."""
    unmerged = mergeable(con) if merge else []
    if unmerged:
        merge_sketches(con, unmerged)
    runs = stale_runs(con, max_staleness)
    if not runs:
        return unmerged
    limit = NO_MAX if max_staleness is None else int(max_staleness)
    tables = interval_tables(con, runs)
    evidence, judged = run_evidence(con, runs)
    if evidence is not None:
        found, outcomes = run_findings(evidence, max_staleness)
        tables["run_finding"] = findings_table([f for f in found if f.severity == "warning"])
        tables["run_check"] = checks_table(outcomes)
    tables["run_state"] = con.execute(_STATE.format(runs=literal(runs), max=literal(limit))).to_arrow_table()
    for table, rows in tables.items():
        who = judged if table in ("run_finding", "run_check") else runs
        con.execute(f"DELETE FROM {table} WHERE run_id IN (SELECT unnest({literal(who)}))")
        _insert(con, table, rows)
    return sorted({*runs, *unmerged})


def _insert(con: duckdb.DuckDBPyConnection, table: str, rows: pa.Table) -> None:
    """Insert `rows` (their columns by name; a table's timestamp columns are now)."""
    if not rows.num_rows:
        return
    columns = ", ".join(rows.column_names)
    stamp = {"run_finding": ", found_at", "run_check": ", checked_at"}.get(table, "")
    now = ", now()" if stamp else ""
    with arrow_view(con, "derived_rows", rows):
        con.execute(f"INSERT INTO {table} ({columns}{stamp}) SELECT *{now} FROM derived_rows ORDER BY ALL")
