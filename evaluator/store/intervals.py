"""The 95% intervals the public views carry (`evaluator.formulas.bootstrap`), computed from the store's
per-step sums (which add over files) for the runs a writer refreshes (`evaluator.store.derived`), for the
views' two groupings: each run (every staleness) and each
(run, staleness). Decision figures get an interval, and so does their excess over the engine floor (the
figure minus `rollout`'s at staleness 0, on the same draws; a run's excess pools its stale tokens only,
staleness >= 1, where the excess is not 0 by construction); the error metrics' means get one too."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa

from evaluator.duck import literal
from evaluator.formulas.bootstrap import REPLICATES, percentile_interval, ratio_replicates, step_draws
from schemas.figures import EXCESS, EXCESS_FIGURES, FIGURES, FLOOR, FLOOR_METHOD, INTERVAL_FIGURES, LEVEL
from schemas.store import METHODS

_STAT = {"sum": "s", "count": "n"}
SUMS: dict[str, tuple[str, str, str, str]] = {
    name: (f.numerator.metric, _STAT[f.numerator.stat], f.denominator.metric, _STAT[f.denominator.stat])
    for name, f in ((name, FIGURES[name]) for name in INTERVAL_FIGURES)
}
"""figure: (numerator metric, its sum `s` or count `n`, denominator metric, its `s` or `n`), from the
catalogue (`schemas.figures`)."""
MEAN_METRICS = (
    "abs_error", "rel_error", "squared_error", "behave_imp_weight_abs_error", "behave_imp_weight_rel_error",
    "importance_weight_abs_error", "importance_weight_rel_error", "grad_weight", "drift", "prob_drift",
    "exp_abs_drift",
)  # fmt: skip
METRICS = tuple(sorted({m for spec in SUMS.values() for m in (spec[0], spec[2])} | set(MEAN_METRICS)))
"""The metrics whose per-step sums the intervals read."""
_DECISION_METRICS = tuple(sorted({m for spec in SUMS.values() for m in (spec[0], spec[2])}))
ALL, STALE = -1, -2
"""The staleness labels of the every-staleness grouping (NULL in the tables) and of the stale tokens'
(staleness >= 1: what a run's excess pools) while computing."""

_METHODS = tuple(sorted(METHODS))
"""The methods in name order: a row's method is its index here (the store's value checks admit no other)."""
_ROWS = f"""
    SELECT list_position({{runs}}, run_id)::INTEGER - 1 AS run, step, staleness,
           list_position({literal(list(_METHODS))}, method)::INTEGER - 1 AS method,
           list_position({literal(list(METRICS))}, metric)::INTEGER - 1 AS metric, file_id, n::DOUBLE AS n,
           sum AS s
    FROM metric_moments
    WHERE run_id IN (SELECT unnest({{runs}})) AND method IN ({{methods}}) AND metric IN ({{metrics}})"""
"""The stored moments of `runs`' `methods` and `metrics` (of `METRICS`), one row per file: runs, methods and
metrics as their indices (in `runs`, `_METHODS`, `METRICS`)."""
_CELL = ("run", "step", "staleness", "method", "metric")


def _step_sums(
    con: duckdb.DuckDBPyConnection, runs: list[str], methods: tuple[str, ...], metrics: tuple[str, ...]
) -> dict[str, np.ndarray]:
    """The per-step sums and counts (`n`, `s`) of each (run, step, staleness, method, metric), its files'
    rows added in file order: the same store gives the same floats whatever DuckDB's threads do. (Added
    here rather than by DuckDB's ordered aggregates, which took seconds on a long run.)"""
    sql = _ROWS.format(runs=literal(runs), methods=", ".join(map(literal, methods)),
                       metrics=", ".join(map(literal, metrics)))  # fmt: skip
    return _ordered_sums(con.execute(sql).fetchnumpy(), _CELL, "file_id")


def _cells(sums: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The per-step sums of each (run, step, staleness, method, metric) (`_step_sums`), with every
    staleness's (`ALL`) and the stale tokens' (`STALE`) added over stalenesses in staleness order."""
    over = [c for c in _CELL if c != "staleness"]
    every = _ordered_sums(sums, over, "staleness")
    stale = _ordered_sums({k: v[sums["staleness"] > 0] for k, v in sums.items()}, over, "staleness")
    for part, label in ((every, ALL), (stale, STALE)):
        part["staleness"] = np.full(len(part["n"]), label, sums["staleness"].dtype)
    return {k: np.concatenate([sums[k], every[k], stale[k]]) for k in sums}


def _ordered_sums(rows: dict[str, np.ndarray], keys: list[str] | tuple[str, ...], order: str) -> dict:
    """`n` and `s` of `rows` added over equal `keys`, each group's rows in `order`'s order."""
    at = np.lexsort([rows[order], *(rows[k] for k in reversed(keys))])
    ordered = {k: rows[k][at] for k in (*keys, "n", "s")}
    new = np.zeros(len(at), bool)
    new[:1] = True
    for k in keys:
        new[1:] |= ordered[k][1:] != ordered[k][:-1]
    starts = np.flatnonzero(new)
    out = {k: ordered[k][starts] for k in keys}
    for k in ("n", "s"):
        out[k] = np.add.reduceat(ordered[k], starts) if len(starts) else ordered[k]
    return out


class _Run:
    """One run's rows of `_cells`: its `[n_steps, cells]` sums and counts of each metric (`per_step`), its
    cells as (staleness, method) in that order."""

    def __init__(self, rows: dict[str, np.ndarray]) -> None:
        self.rows = rows
        steps, self.step_index = np.unique(rows["step"], return_inverse=True)
        self.n_steps = len(steps)
        cells, self.cell = np.unique(
            rows["staleness"].astype(np.int64) * len(_METHODS) + rows["method"], return_inverse=True
        )
        self.cells = [(int(c // len(_METHODS)), _METHODS[c % len(_METHODS)]) for c in cells.tolist()]
        present = np.flatnonzero(np.bincount(rows["metric"], minlength=len(METRICS)))
        self._of_metric = {METRICS[m]: rows["metric"] == m for m in present.tolist()}

    def per_step(self, metric: str, stat: str) -> np.ndarray:
        """`[n_steps, cells]` of one metric's per-step sums or counts (0 where a cell has none)."""
        table = np.zeros((self.n_steps, len(self.cells)))
        at = self._of_metric.get(metric)
        if at is not None:
            table[self.step_index[at], self.cell[at]] = self.rows[stat][at]
        return table


def _run_rows(run: _Run) -> tuple[list[dict], list[dict]]:
    """One run's decision and mean interval rows, every staleness and each one."""
    draws = step_draws(run.n_steps)
    replicates = {}
    for figure, (num, num_stat, den, den_stat) in SUMS.items():
        numerator, denominator = run.per_step(num, num_stat), run.per_step(den, den_stat)
        replicates[figure] = (ratio_replicates(numerator, denominator, draws), denominator.sum(axis=0) > 0)
    decision, pooled = [], _excess_cells(run.cells)
    for figure, (reps, present) in replicates.items():
        lower, upper = percentile_interval(reps)
        floor = _floor(reps, run.cells)
        excess = None
        if figure in EXCESS_FIGURES:
            own = np.where(pooled >= 0, reps[:, np.maximum(pooled, 0)], np.nan)  # (R, C)
            excess = percentile_interval(own - floor[:, None])
        for i, (staleness, method) in enumerate(run.cells):
            if not present[i] or method == "ground_truth" or staleness == STALE:
                continue
            row = dict(staleness=staleness, method=method, n_steps=run.n_steps, figure=figure,
                       lower=lower[i], upper=upper[i])  # fmt: skip
            if excess is not None:
                row |= dict(excess_lower=excess[0][i], excess_upper=excess[1][i])
            decision.append(row)
    means = []
    for metric in MEAN_METRICS:
        reps = ratio_replicates(run.per_step(metric, "s"), run.per_step(metric, "n"), draws)
        lower, upper = percentile_interval(reps)
        for i, (staleness, method) in enumerate(run.cells):
            if staleness != STALE and np.isfinite(lower[i]):
                means.append(
                    dict(staleness=staleness, method=method, metric=metric, lower=lower[i], upper=upper[i])
                )
    return decision, means


def _excess_cells(cells: list[tuple[int, str]]) -> np.ndarray:
    """`[cells]` the cell whose replicates each cell's excess is taken from: its own, but the stale tokens'
    for every staleness (-1 where a method has none)."""
    position = {cell: i for i, cell in enumerate(cells)}
    return np.array(
        [position.get((STALE, method), -1) if s == ALL else i for i, (s, method) in enumerate(cells)]
    )


def _floor(replicates: np.ndarray, cells: list[tuple[int, str]]) -> np.ndarray:
    """`[replicates]` the engine floor's replicates: `rollout` at staleness 0 (NaN when not measured)."""
    key = (0, FLOOR_METHOD)
    if key not in cells:
        return np.full(replicates.shape[0], np.nan)
    return replicates[:, cells.index(key)]


def interval_tables(con: duckdb.DuckDBPyConnection, runs: list[str]) -> dict[str, pa.Table]:
    """`decision_interval` and `mean_interval` rows of `runs`, from the store's moments."""
    runs = sorted(runs)
    rows = _cells(_step_sums(con, runs, _METHODS, METRICS))
    decision, means = [], []
    for code, run_id in enumerate(runs):
        at = rows["run"] == code
        if not at.any():
            continue
        found = _run_rows(_Run({k: v[at] for k, v in rows.items()}))
        decision += [r | {"run_id": run_id} for r in found[0]]
        means += [r | {"run_id": run_id} for r in found[1]]
    return {"decision_interval": _arrow(decision, _COLUMNS["decision_interval"]),
            "mean_interval": _arrow(means, _COLUMNS["mean_interval"])}  # fmt: skip


def _arrow(rows: list[dict], columns: tuple[str, ...]) -> pa.Table:
    """The rows as a table of `columns`: NaN and the every-staleness label become nulls."""

    def value(row: dict, column: str):
        v = row.get(column)
        if column == "staleness" and v == ALL:
            return None
        return None if isinstance(v, float) and np.isnan(v) else v

    return pa.Table.from_pylist([{c: value(r, c) for c in columns} for r in rows], schema=_SCHEMAS[columns])


_COLUMNS = {
    "decision_interval": (
        "run_id", "staleness", "method", "n_steps", "figure", "lower", "upper", "excess_lower",
        "excess_upper",
    ),
    "mean_interval": ("run_id", "staleness", "method", "metric", "lower", "upper"),
}  # fmt: skip


_TYPES = {"run_id": pa.string(), "staleness": pa.int32(), "method": pa.string(), "n_steps": pa.int32(),
          "figure": pa.string(), "metric": pa.string()}  # fmt: skip
_SCHEMAS = {
    columns: pa.schema([(c, _TYPES.get(c, pa.float64())) for c in columns]) for columns in _COLUMNS.values()
}


def selection_intervals(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    figure: str,
    method: str | None,
    ranges: list[tuple[int, int]],
    family: int = 1,
) -> tuple[list[tuple[float | None, float | None]], int]:
    """([(lower, upper)] per staleness range, steps): the interval of one figure of one run over each
    inclusive staleness range, on the draws of the store's intervals, at 95% for each (`family` 1) or for
    `family` of them together (Bonferroni: each at 1 - 0.05 / family, on `REPLICATES * family` draws, so that
    each bound rests on as many replicates beyond it as a 95% one). The figure is a decision figure,
    `excess_<figure>` (minus the engine floor's), `floor_<figure>` (the floor's own; no method) or
    `mean:<metric>` (a metric's mean). Only the sums it needs are read (the steps of the run that have any
    of the intervals' metrics set the draws)."""
    metrics = ", ".join(map(literal, METRICS))
    sql = (
        f"SELECT DISTINCT step FROM metric_moments WHERE run_id = {literal(run_id)} AND metric IN ({metrics})"
    )
    steps = np.sort(con.execute(sql).fetchnumpy()["step"])
    if not len(steps):
        return [(None, None)] * len(ranges), 0
    draws = step_draws(len(steps), REPLICATES * family)
    base = figure.removeprefix(EXCESS).removeprefix(FLOOR).removeprefix("mean:")
    num, num_stat, den, den_stat = SUMS.get(base, (base, "s", base, "n"))
    metrics = _DECISION_METRICS if base in SUMS else (num, den)  # a judging's figures: one query (`Memo`)
    rows = _step_sums(con, [run_id], (method or FLOOR_METHOD, FLOOR_METHOD), metrics)
    step_index = np.minimum(np.searchsorted(steps, rows["step"]), len(steps) - 1)
    known = steps[step_index] == rows["step"]  # a metric's steps outside the intervals' are left out

    def replicates(who: str, selected: list[tuple[int, int]]) -> np.ndarray:
        """`[replicates, ranges]` of `who` over each staleness range."""

        def sums(metric: str, stat: str) -> np.ndarray:  # (n_steps, ranges), stalenesses added in order
            at = known & (rows["method"] == _METHODS.index(who)) & (rows["metric"] == METRICS.index(metric))
            levels, level_index = np.unique(rows["staleness"][at], return_inverse=True)
            cells = np.zeros((len(steps), len(levels)))
            cells[step_index[at], level_index] = rows[stat][at]
            return np.stack([cells[:, (levels >= lo) & (levels <= hi)].sum(axis=1) for lo, hi in selected], 1)

        return ratio_replicates(sums(num, num_stat), sums(den, den_stat), draws)

    if figure.startswith(FLOOR):
        reps = replicates(FLOOR_METHOD, [(0, 0)] * len(ranges))
    else:
        reps = replicates(method, ranges)
        if figure.startswith(EXCESS):
            reps = reps - replicates(FLOOR_METHOD, [(0, 0)])
    lower, upper = percentile_interval(reps, 1 - (1 - LEVEL) / family)
    bounds = [
        tuple(None if np.isnan(v) else float(v) for v in pair) for pair in zip(lower, upper, strict=True)
    ]
    return bounds, len(steps)


def selection_interval(
    con: duckdb.DuckDBPyConnection, run_id: str, figure: str, method: str | None, lo: int, hi: int
) -> tuple[float | None, float | None, int]:
    """(lower, upper, steps) of the 95% interval of one figure of one run over staleness [lo, hi]
    (`selection_intervals`)."""
    ((lower, upper),), steps = selection_intervals(con, run_id, figure, method, [(lo, hi)])
    return lower, upper, steps
