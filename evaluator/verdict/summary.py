"""`proxaudit summary`: read the public views of the metrics store and render them, after the decision on
each run (`evaluator.verdict`)."""

from __future__ import annotations

import csv
import io
import json
import math
import os
from itertools import groupby

import pyarrow as pa

from evaluator.duck import literal
from evaluator.errors import NoGroundTruthError, UsageError
from evaluator.gate import DEFAULT_THRESHOLDS
from evaluator.store import open_store
from evaluator.store.reader import require_run, runs_without_truth
from evaluator.store.trainers import trainer_report
from evaluator.text_table import fitted_lines, printable, wrapped
from evaluator.validate.no_truth import no_truth_message
from evaluator.verdict.judging import judge_db
from evaluator.verdict.words import run_line
from schemas.figures import EXCESS, FLOOR, Observed, bounds, lookup, with_bounds
from schemas.store import DEFAULT_TOLERANCE, FLOOR_COLUMNS, METHODS, METRICS, Tolerance

VIEW_BY = {
    "run": "run_summary",
    "staleness": "staleness_summary",
    "step": "step_summary",
    "pairing": "pairing_summary",
    "decision": "decision_summary",
    "decision-staleness": "decision_staleness_summary",
    "weights": "weight_summary",
    "weights-staleness": "weight_staleness_summary",
    "rollout-corr": "rollout_corr_summary",
    "rollout-corr-staleness": "rollout_corr_staleness_summary",
    "mismatch": "mismatch_summary",
    "trainers": "trainer_mismatch",
    "what-if": "what_if",
}
# Views keyed by method but not metric, and those keyed by neither: their order and what filters apply.
ORDER_BY = {
    "pairing": ["run_id", "interpolation"],
    "decision": ["run_id", "method"],
    "decision-staleness": ["run_id", "staleness", "method"],
    "weights": ["run_id", "method"],
    "weights-staleness": ["run_id", "staleness", "method"],
    "rollout-corr": ["run_id", "method"],
    "rollout-corr-staleness": ["run_id", "staleness", "method"],
    "mismatch": ["run_id", "staleness"],
    "trainers": ["run_id", "trainer <> 'proxaudit'", "trainer", "metric"],
    "what-if": ["run_id", "NOT own", "loss", "method"],
}
FORMATS = ("table", "json", "csv")
PAIRING_NOTE = (
    "shipped_over_own: how much AReaL's shipped version pairing (each token interpolated with the previous "
    "token's version) changes the mean abs_error on this run. AReaL's own logged loglinear/* and linear/* "
    "metrics match loglinear_shipped and linear_shipped, not loglinear and linear."
)
NOTES = {
    "pairing": PAIRING_NOTE,
    "decision": "gradient_mass_error: the share of the policy-gradient mass the estimate moves (sum |W(a) - "
    "W(g)| / sum W(g)) under the store's loss; *_flip_rate: tokens whose clip or bound decision the "
    "estimate flips; (95%: ...): the interval, a bootstrap over steps; excess_*: the figure over the stale "
    "tokens (staleness >= 1) minus the engine floor's (behave_logp at staleness 0); safe_staleness (95%: "
    "with confidence to at most): the largest staleness up to which every staleness with enough tokens meets "
    "the tolerance (-1: not even staleness 0), absolute and beyond the floor. The decisions above judge each "
    "staleness 1 to S on its own (proxaudit gate's checks). JSON and CSV carry every column (--format json).",
    "what-if": "each run's decision under each loss of `replay --loss a,b,c` (own: the store's loss, which "
    "the gate judges; the others replayed from the same files into scratch stores), judged by the same "
    "thresholds at the same staleness: action, max_staleness (k: safe up to it) of judged_staleness (S); "
    "the figures pooled over every staleness with their 95% intervals. JSON and CSV carry every column "
    "(the sentences, the reason, each interval).",
    "mismatch": "staleness 0 is the engine mismatch floor (inference engine vs trainer at one version): "
    "verl calls a mean prob_drift below 0.005 normal and above 0.01 a precision problem, NeMo-RL flags a "
    "mean exp_abs_drift above 1.05; floor_share: how much of each staleness's drift the floor explains.",
}


_FLOOR_COLUMNS = ", ".join(f"f.{c} AS {FLOOR}{c}" for name in FLOOR_COLUMNS for c in with_bounds(name))
DECISION_SOURCE = f"""(
    SELECT d.*, s.* EXCLUDE (run_id, method), {_FLOOR_COLUMNS}
    FROM decision_summary d LEFT JOIN {Tolerance.SQL} s USING (run_id, method)
    LEFT JOIN engine_floor f USING (run_id))"""
"""`--by decision`: each method's figures with their intervals and excess over the engine floor, its safe
staleness (absolute and beyond the floor, each with its 95% bounds), and its run's floor; the tolerance's
values go in its places (`Tolerance.SQL`)."""
COMPACT = {
    **dict.fromkeys(
        ("run", "staleness"),
        ("run_id", "staleness", "method", "metric", "n", "mean", "min", "max", "p50", "p90", "p99"),
    ),
    "decision": (
        "run_id", "method", "n", "gradient_mass_error", "clip_flip_rate", "excess_gradient_mass_error",
        "safe_staleness", "safe_staleness_beyond_floor",
    ),
    "trainers": ("run_id", "trainer", "metric", "value", "line", "within_line", "n"),
    "what-if": (
        "run_id", "loss", "own", "action", "max_staleness", "judged_staleness", "excess_gradient_mass_error",
        "clip_flip_rate", "safe_staleness_beyond_floor",
    ),
}  # fmt: skip
"""The columns a terminal table shows (figures with their intervals); JSON and CSV carry every column."""


def summary_table(
    db_path: str | os.PathLike,
    *,
    by: str = "run",
    run: str | None = None,
    method: str | None = None,
    metric: str | None = None,
    tolerance: Tolerance = DEFAULT_TOLERANCE,
) -> pa.Table:
    """Rows of a public view (`VIEW_BY`), filtered and sorted; `--by decision` adds each method's safe
    staleness at `tolerance`.

    A missing database is a `StoreError`; an unknown run, method or metric is a `UsageError`."""
    if by not in VIEW_BY:
        raise UsageError(f"--by must be one of {', '.join(VIEW_BY)}, not {by!r}")
    keyed = ORDER_BY.get(by, ["method", "metric"])
    for name, value, known in (("method", method, METHODS), ("metric", metric, METRICS)):
        if value is not None and value not in known:
            raise UsageError(f"unknown {name} {value!r}; known: {', '.join(known)}")
        if value is not None and name not in keyed:
            raise UsageError(f"--by {by} has no {name} column: leave out --{name}")
    filters = {"run_id": run, "method": method, "metric": metric}
    where = [f"{column} = {literal(value)}" for column, value in filters.items() if value is not None]
    source = VIEW_BY[by]
    if by == "decision":
        source = DECISION_SOURCE.format(*map(literal, tolerance.values()))
    order = ORDER_BY.get(by, ["run_id", *([by] if by != "run" else []), "method", "metric"])
    condition = "WHERE " + " AND ".join(where) if where else ""
    sql = f"SELECT * FROM {source} {condition} ORDER BY {', '.join(order)}"
    with open_store(db_path) as con:
        require_run(con, run, db_path)
        return con.sql(sql).to_arrow_table()


def decision_lines(
    db_path: str | os.PathLike,
    thresholds: str | os.PathLike = DEFAULT_THRESHOLDS,
    run: str | None = None,
    max_staleness: int | None = None,
    tolerance: Tolerance = DEFAULT_TOLERANCE,
) -> list[str]:
    """The decision on each run (every run, or `run`), one line each, after the loss the store's figures
    were computed under (`evaluator.verdict`)."""
    judgement = judge_db(db_path, thresholds, run, max_staleness, tolerance)
    return [judgement.loss_line(), *(f"- {run_line(d)}" for d in judgement.decisions)]


def stored_runs(db_path: str | os.PathLike) -> list[str]:
    """The runs the store holds (none: nothing was replayed into it yet)."""
    with open_store(db_path) as con:
        return [r for (r,) in con.execute("SELECT DISTINCT run_id FROM file_tokens ORDER BY 1").fetchall()]


def trainers_text(db_path: str | os.PathLike, run: str | None) -> str:
    """One sentence per run and trainer: what each trainer would log on the run (`trainer_mismatch`)."""
    with open_store(db_path) as con:
        return "\n".join(trainer_report(con, run)[1])


def what_if_lines(table: pa.Table) -> list[str]:
    """Per run, each loss's decision in one sentence: the store's own loss first."""
    out = []
    ordered = sorted(table.to_pylist(), key=lambda r: r["run_id"])  # stable: each run's own loss first
    for run, group in groupby(ordered, key=lambda r: r["run_id"]):
        out.append(f"Run {printable(run)}, what if the trainer ran another loss:")
        for row in group:
            mark = " (the store's loss)" if row["own"] else ""
            out.append(f"- under {printable(row['loss'])}{mark}: {printable(row['sentence'])}")
    return out


def truth_notes(db_path: str | os.PathLike, run: str | None = None) -> list[str]:
    """The sentence of each run of the selection (every run, or `run`) none of whose tokens has prox_logp:
    the ground truth every error and decision figure needs."""
    with open_store(db_path) as con:
        without = runs_without_truth(con)
    return [no_truth_message(r, n) for r, n in without.items() if run in (None, r)]


def require_rows(table: pa.Table, notes: list[str]) -> None:
    """`NoGroundTruthError` saying `notes` when they leave the table empty: runs without ground truth and
    no row to show, which an empty table would pass off as a clean result."""
    if notes and not table.num_rows:
        raise NoGroundTruthError("; ".join(notes))


def _cell(value: object) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    return str(value)


def _display(column: str) -> str:
    """How a column of a figure reads (the catalogue's display; a number when it is no figure)."""
    try:
        return lookup(column.removeprefix(EXCESS) if column.startswith(EXCESS) else column)[0].display
    except KeyError:
        return "number"


def compact(table: pa.Table, by: str) -> pa.Table:
    """The terminal's view of a wide table: its `COMPACT` columns, each figure with its interval as it
    reads (`Observed.format`: '2.33% (95%: 1.80-2.91%)'; the safe staleness '0 (95%: 0 to 5)')."""
    if by not in COMPACT:
        return table
    rows, names = table.to_pylist(), table.column_names
    out = {}
    for column in (c for c in COMPACT[by] if c in names):
        low, high = bounds(column)
        if low in names:
            display = _display(column)
            out[column] = [Observed(r[column], r[low], r[high], display=display).format() for r in rows]
        else:
            out[column] = table.column(column)
    return pa.table(out)


def render(table: pa.Table, fmt: str = "table", width: int | None = None) -> str:
    """The rows as an aligned text table within `width` characters (columns that do not fit are left out,
    and said), JSON (a list of objects) or CSV."""
    rows = table.to_pylist()
    if fmt == "json":
        return json.dumps(rows, indent=1, default=str)  # a timestamp (what_if.judged_at) as ISO text
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
    lines, dropped = fitted_lines(cells, width, right=numeric)
    if dropped:
        note = f"(left out to fit {width} characters: {', '.join(dropped)}; --format json or csv has them)"
        lines += wrapped(note, width).splitlines()
    return "\n".join(lines)
