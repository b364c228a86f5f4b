"""The 95% intervals the public views carry (`evaluator.formulas.bootstrap`), computed from the store's
per-step sums (which add over files) for the runs a writer refreshes (`evaluator.store.derived`), for the
views' two groupings: each run (every staleness) and each
(run, staleness). Decision figures get an interval, and so does their excess over the engine floor (the
figure minus `rollout`'s at staleness 0, on the same draws); the error metrics' means get one too."""

from __future__ import annotations

from typing import TYPE_CHECKING

import duckdb
import numpy as np
import pyarrow as pa

from evaluator.formulas.bootstrap import percentile_interval, ratio_replicates, step_draws
from schemas.store import EXCESS_FIGURES, INTERVAL_FIGURES

if TYPE_CHECKING:  # pandas only when intervals are computed: importing the store does not load it
    import pandas as pd

FIGURES: dict[str, tuple[str, str, str, str]] = {
    figure: ("grad_weight_abs_error", "s", "true_grad_weight", "s")
    if figure == "gradient_mass_error"
    else (figure.removesuffix("_rate"), "s", figure.removesuffix("_rate"), "n")
    for figure in INTERVAL_FIGURES
}
"""figure: (numerator metric, its sum `s` or count `n`, denominator metric, its `s` or `n`)."""
FLOOR_METHOD = "rollout"
MEAN_METRICS = (
    "abs_error", "rel_error", "squared_error", "behave_imp_weight_abs_error", "behave_imp_weight_rel_error",
    "importance_weight_abs_error", "importance_weight_rel_error", "grad_weight", "drift", "prob_drift",
    "exp_abs_drift",
)  # fmt: skip
METRICS = tuple(sorted({m for spec in FIGURES.values() for m in (spec[0], spec[2])} | set(MEAN_METRICS)))
"""The metrics whose per-step sums the intervals read."""
ALL = -1
"""The staleness label of the every-staleness grouping while computing (NULL in the tables)."""

_SUMS = """
    SELECT run_id, step, staleness, method, metric, sum(n)::DOUBLE AS n, sum(sum ORDER BY file_id) AS s
    FROM metric_moments WHERE metric IN ({metrics}) AND run_id IN (SELECT unnest($runs))
    GROUP BY ALL ORDER BY ALL"""
"""Ordered sums, ordered rows: the same store gives the same floats whatever DuckDB's threads do."""


def _per_step(wide: pd.DataFrame, metric: str, stat: str, cells: pd.MultiIndex, steps) -> np.ndarray:
    """`[n_steps, cells]` of one metric's per-step sums or counts (0 where a cell has none), from the run's
    table of every metric's sums and counts by step (`_run_rows`)."""
    if (stat, metric) not in wide.columns:
        return np.zeros((len(steps), len(cells)))
    part = wide[stat][metric]
    return part.reindex(index=steps, columns=cells, fill_value=0.0).to_numpy(np.float64)


def _run_rows(frame: pd.DataFrame) -> tuple[list[dict], list[dict]]:
    """One run's decision and mean interval rows, every staleness and each one."""
    import pandas as pd

    everything = frame.assign(staleness=ALL)
    frame = pd.concat([frame, everything], ignore_index=True)
    steps = np.sort(frame["step"].unique())
    draws = step_draws(len(steps))
    cells = pd.MultiIndex.from_frame(frame[["staleness", "method"]].drop_duplicates())
    wide = frame.pivot_table(  # one table of every metric's sums and counts by step
        index="step",
        columns=["metric", "staleness", "method"],
        values=["n", "s"],
        aggfunc="sum",
        fill_value=0.0,
    )
    replicates = {}
    for figure, (num, num_stat, den, den_stat) in FIGURES.items():
        numerator = _per_step(wide, num, num_stat, cells, steps)
        denominator = _per_step(wide, den, den_stat, cells, steps)
        replicates[figure] = (ratio_replicates(numerator, denominator, draws), denominator.sum(axis=0) > 0)
    decision = []
    for figure, (reps, present) in replicates.items():
        lower, upper = percentile_interval(reps)
        floor = _floor(reps, cells)
        excess = percentile_interval(reps - floor[:, None]) if figure in EXCESS_FIGURES else None
        for i, (staleness, method) in enumerate(cells):
            if not present[i] or method == "ground_truth":
                continue
            row = dict(staleness=staleness, method=method, n_steps=len(steps), figure=figure,
                       lower=lower[i], upper=upper[i])  # fmt: skip
            if excess is not None:
                row |= dict(excess_lower=excess[0][i], excess_upper=excess[1][i])
            decision.append(row)
    means = []
    for metric in MEAN_METRICS:
        reps = ratio_replicates(
            _per_step(wide, metric, "s", cells, steps), _per_step(wide, metric, "n", cells, steps), draws
        )
        lower, upper = percentile_interval(reps)
        for i, (staleness, method) in enumerate(cells):
            if np.isfinite(lower[i]):
                means.append(
                    dict(staleness=staleness, method=method, metric=metric, lower=lower[i], upper=upper[i])
                )
    return decision, means


def _floor(replicates: np.ndarray, cells: pd.MultiIndex) -> np.ndarray:
    """`[replicates]` the engine floor's replicates: `rollout` at staleness 0 (NaN when not measured)."""
    key = (0, FLOOR_METHOD)
    if key not in cells:
        return np.full(replicates.shape[0], np.nan)
    return replicates[:, cells.get_loc(key)]


def interval_tables(con: duckdb.DuckDBPyConnection, runs: list[str]) -> dict[str, pa.Table]:
    """`decision_interval` and `mean_interval` rows of `runs`, from the store's moments."""
    sql = _SUMS.format(metrics=", ".join(f"'{m}'" for m in METRICS))
    frame = con.execute(sql, {"runs": runs}).df()
    decision, means = [], []
    for run_id, part in frame.groupby("run_id", sort=True):
        rows = _run_rows(part)
        decision += [r | {"run_id": run_id} for r in rows[0]]
        means += [r | {"run_id": run_id} for r in rows[1]]
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


_STEP_SUMS = """
    SELECT step, sum(n)::DOUBLE AS n, sum(sum ORDER BY staleness, file_id) AS s FROM metric_moments
    WHERE run_id = ? AND metric = ? AND method = ? AND staleness BETWEEN ? AND ? GROUP BY step"""


def selection_interval(
    con: duckdb.DuckDBPyConnection, run_id: str, figure: str, method: str | None, lo: int, hi: int
) -> tuple[float | None, float | None, int]:
    """(lower, upper, steps) of the 95% interval of one figure of one run over staleness [lo, hi], on the
    draws of the store's intervals: a decision figure, `excess_<figure>` (minus the engine floor's),
    `floor_<figure>` (the floor's own; no method) or `mean:<metric>` (a metric's mean). Only the sums it
    needs are read, per step (the steps of the run that have any of the intervals' metrics set the draws)."""
    marks = ", ".join("?" * len(METRICS))
    sql = f"SELECT DISTINCT step FROM metric_moments WHERE run_id = ? AND metric IN ({marks})"
    steps = np.sort(con.execute(sql, [run_id, *METRICS]).fetchnumpy()["step"])
    if not len(steps):
        return None, None, 0
    draws = step_draws(len(steps))

    def sums(metric: str, stat: str, who: str, low: int, high: int) -> np.ndarray:
        """`[n_steps, 1]` one metric's per-step sums or counts of `who` over staleness [low, high]."""
        by_step = con.execute(_STEP_SUMS, [run_id, metric, who, low, high]).df().set_index("step")[stat]
        return by_step.reindex(steps, fill_value=0.0).to_numpy(np.float64)[:, None]

    def replicates(name: str, who: str, low: int, high: int) -> np.ndarray:
        if name.startswith("mean:"):
            metric = name.removeprefix("mean:")
            spec = (metric, "s", metric, "n")
        else:
            spec = FIGURES[name]
        return ratio_replicates(
            sums(spec[0], spec[1], who, low, high), sums(spec[2], spec[3], who, low, high), draws
        )

    if figure.startswith("floor_"):
        reps = replicates(figure.removeprefix("floor_"), FLOOR_METHOD, 0, 0)
    elif figure.startswith("excess_"):
        base = figure.removeprefix("excess_")
        reps = replicates(base, method, lo, hi) - replicates(base, FLOOR_METHOD, 0, 0)
    else:
        reps = replicates(figure, method, lo, hi)
    lower, upper = percentile_interval(reps)
    values = [None if np.isnan(v) else float(v) for v in (lower[0], upper[0])]
    return values[0], values[1], len(steps)
