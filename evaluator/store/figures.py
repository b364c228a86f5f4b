"""The store's figures as `schemas.figures.Observed` values: what the gate, the verdict, `summary` and the
dashboard judge and show, read here and only here. A metric's statistic over a staleness range; a derived
figure of the catalogue (a decision figure, its excess over the engine floor, a weight diagnostic, the safe
staleness, the floor itself, the run's warnings), each with its 95% interval where it has one; a figure at
each staleness of a range, the intervals family-wise; the engine floor of every run."""

from __future__ import annotations

import duckdb

from evaluator.duck import literal
from evaluator.store.intervals import MEAN_METRICS, selection_interval, selection_intervals
from schemas.figures import FIGURE_TABLE, FIGURES, FLOOR_METHOD, Observed, lookup, with_bounds
from schemas.store import FLOOR_COLUMNS, STATS
from schemas.thresholds import Check

ALL_STALENESS = (-(2**31), 2**31 - 1)
# Each query below reads what a judging asks of one method (every metric, every figure of a view) and the
# caller keeps the part it asked for: a judging asks the same query for many checks, and a `Memo` answers it
# once (each query over the store costs about the same whatever it keeps: mostly the scan of its files).
# n, mean, min, max and p50/p90/p99 per run over a staleness range, by the macro of the public views (with
# the full range it is `run_summary`, with one staleness `staleness_summary`).
_SELECTION_SQL = f"""
    SELECT metric, run_id, {", ".join(STATS)} FROM summary_over(lo := {{lo}}, hi := {{hi}})
    WHERE method = {{method}} ORDER BY metric, run_id"""
_STORED_MEAN_SQL = """
    SELECT i.metric, i.run_id, i.lower, i.upper, d.n_steps FROM mean_interval i
    JOIN (SELECT run_id, max(n_steps) AS n_steps FROM decision_interval GROUP BY run_id) d USING (run_id)
    WHERE i.staleness IS NULL AND i.method = {method}"""
_RUNS_WITH_SQL = "SELECT DISTINCT metric, run_id FROM metric_moments WHERE method = {method} AND n > 0"
_VIEW_FIGURES = {
    view: tuple(f.name for f in FIGURE_TABLE if f.view == view) for view in ("decision", "weight")
}
"""The figures of which each of the macros `decision_over` and `weight_over` has a column."""
_OVER_SQL = """
    SELECT run_id, staleness, n, {names} FROM {view}_over(lo := {lo}, hi := {hi}, by_staleness := {each})
    WHERE method = {method} ORDER BY run_id, staleness"""
_FLOOR_POINT_SQL = "SELECT run_id, {names} FROM decision_over(lo := 0, hi := 0) WHERE method = {method}"
_SAFE_STALENESS_SQL = """
    SELECT s.run_id, {columns},
           (SELECT coalesce(sum(d.n), 0) FROM decision_staleness_summary d
            WHERE d.run_id = s.run_id AND d.method = s.method AND d.n >= {min_tokens}) AS n
    FROM safe_staleness(max_gradient_mass_error := {max_gme}, max_clip_flip_rate := {max_flip},
                        min_tokens := {min_tokens}) s
    WHERE s.method = {method}"""
_WARNINGS_SQL = """
    SELECT run_id, sum(n_tokens)::BIGINT AS n,
           (SELECT count(*) FROM run_finding f WHERE f.run_id = t.run_id) AS warnings
    FROM file_tokens t GROUP BY run_id"""


def selection_stats(
    con: duckdb.DuckDBPyConnection, method: str, metric: str, staleness: tuple[int, int] | None = None
) -> dict[str, dict[str, Observed]]:
    """`{run_id: {stat: Observed}}` of n, mean, min, max, p50, p90, p99 over the tokens with staleness in
    `[lo, hi]` (every token if None); the mean with its 95% interval where the store keeps one for the
    metric. Runs without such tokens are absent."""
    lo, hi = staleness if staleness is not None else ALL_STALENESS
    values = {"method": method, "lo": lo, "hi": hi}
    sql = _SELECTION_SQL.format(**{k: literal(v) for k, v in values.items()})
    rows = _of_metric(con.execute(sql).fetchall(), metric)
    out = {}
    stored = {}
    if metric in MEAN_METRICS and staleness is None:  # the whole run: the interval the store keeps
        sql = _STORED_MEAN_SQL.format(method=literal(method))
        stored = {r[0]: r[1:] for r in _of_metric(con.execute(sql).fetchall(), metric)}
    for run_id, *values in rows:
        n = int(values[0])
        stats = {stat: Observed(value, n=n) for stat, value in zip(STATS, values, strict=True)}
        if metric in MEAN_METRICS:
            lower, upper, steps = stored.get(run_id) or selection_interval(
                con, run_id, f"mean:{metric}", method, lo, hi
            )
            stats["mean"] = Observed(stats["mean"].value, lower, upper, n, steps)
        out[run_id] = stats
    return out


def _of_metric(rows: list[tuple], metric: str) -> list[tuple]:
    """The rows of `metric`, without their first column, the metric."""
    return [row[1:] for row in rows if row[0] == metric]


def runs_with_metric(con: duckdb.DuckDBPyConnection, method: str, metric: str) -> set[str]:
    """The runs with tokens of `metric` of `method`."""
    rows = con.execute(_RUNS_WITH_SQL.format(method=literal(method))).fetchall()
    return {run for (run,) in _of_metric(rows, metric)}


def observe(
    con: duckdb.DuckDBPyConnection, check: Check, staleness: tuple[int, int] | None = None
) -> dict[str, Observed]:
    """`{run_id: Observed}` of what `check` judges (its statistic, or its figure, in the figure's display),
    over the staleness range `staleness` (every token if None), for every run that has tokens there. The
    safe staleness counts the tokens of the levels with at least `min_tokens` tokens (0 when none has
    enough); the engine floor its tokens at staleness 0; the warnings the run's tokens."""
    if check.figure is None:
        return {run: stats[check.stat] for run, stats in selection_stats(con, check.method, check.metric,
                                                                          staleness).items()}  # fmt: skip
    figure, variant = lookup(check.figure)
    if figure.view == "findings":
        rows = con.execute(_WARNINGS_SQL).fetchall()
        return {run: Observed(count, n=n, display=figure.display) for run, n, count in rows}
    if figure.view == "safe_staleness":
        columns = ", ".join(f"s.{c}" for c in with_bounds(figure.name))
        sql = _SAFE_STALENESS_SQL.format(
            columns=columns, method=literal(check.method), max_gme=literal(check.max_gradient_mass_error),
            max_flip=literal(check.max_clip_flip_rate), min_tokens=literal(check.min_tokens),
        )  # fmt: skip
        rows = con.execute(sql).fetchall()
        return {run: Observed(v, lo, hi, n, display="level") for run, v, lo, hi, n in rows}
    if variant == "floor":
        return {run: floor[figure.name] for run, floor in engine_floors(con).items()}
    lo, hi = staleness if staleness is not None else ALL_STALENESS
    out = {}
    for (run_id, _), (n, value) in _points(con, check, lo, hi).items():
        lower = upper = steps = None
        if figure.interval:
            lower, upper, steps = selection_interval(con, run_id, check.figure, check.method, lo, hi)
        out[run_id] = Observed(value, lower, upper, n, steps, figure.display)
    return out


def _points(
    con: duckdb.DuckDBPyConnection, check: Check, lo: int, hi: int, each: bool = False
) -> dict[tuple[str, int | None], tuple[int, float | None]]:
    """`{(run_id, staleness): (tokens, value)}` of a decision or weight figure (or its excess over the engine
    floor) over staleness [lo, hi], from the exact sums: pooled (staleness None), or at `each` staleness."""
    figure, variant = lookup(check.figure)
    names = _VIEW_FIGURES[figure.view]
    column = names.index(figure.name)
    sql = _OVER_SQL.format(names=", ".join(names), view=figure.view, method=literal(check.method),
                           lo=literal(lo), hi=literal(hi), each=literal(each))  # fmt: skip
    rows = [(*row[:3], row[3 + column]) for row in con.execute(sql).fetchall()]
    floors = {}
    if variant == "excess":
        sql = _FLOOR_POINT_SQL.format(names=", ".join(names), method=literal(FLOOR_METHOD))
        floors = {row[0]: row[1 + column] for row in con.execute(sql).fetchall()}
    out = {}
    for run_id, staleness, n, value in rows:
        if variant == "excess":
            floor = floors.get(run_id)
            value = None if value is None or floor is None else value - floor
        out[run_id, staleness] = (n, value)
    return out


def observe_levels(
    con: duckdb.DuckDBPyConnection, check: Check, run_id: str, levels: list[int]
) -> dict[int, Observed]:
    """The check's figure of `run_id` at each staleness of `levels` on its own, the intervals family-wise
    95% over all of them (each at 1 - 0.05 / len(levels): Bonferroni); a level without tokens is absent."""
    found = _points(con, check, levels[0], levels[-1], each=True)
    points = {s: found[run_id, s] for s in levels if (run_id, s) in found}
    if not points:
        return {}
    ranges = [(s, s) for s in points]
    bounds, steps = selection_intervals(con, run_id, check.figure, check.method, ranges, len(levels))
    display = lookup(check.figure)[0].display
    return {
        s: Observed(value, lower, upper, n, steps, display, len(levels))
        for (s, (n, value)), (lower, upper) in zip(points.items(), bounds, strict=True)
    }


def engine_floors(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, Observed]]:
    """Each run's engine floor (the view `engine_floor`): `rollout`'s decision figures at staleness 0 and
    the drift there, `{name: Observed}` with their 95% intervals."""
    names = [column for name in FLOOR_COLUMNS for column in with_bounds(name)]
    rows = con.execute(f"SELECT run_id, n, n_steps, {', '.join(names)} FROM engine_floor").fetchall()
    out = {}
    for run_id, n, steps, *values in rows:
        out[run_id] = {
            name: Observed(
                *values[3 * i : 3 * i + 3], n, steps, FIGURES[name].display if name in FIGURES else "number"
            )
            for i, name in enumerate(FLOOR_COLUMNS)
        }
    return out


def stale_levels(con: duckdb.DuckDBPyConnection, min_tokens: int) -> dict[str, int]:
    """Each run's largest staleness with at least `min_tokens` loss tokens with `prox_logp` (runs with none
    are absent): the staleness judged up to when nothing says what the trainer runs."""
    sql = f"""SELECT run_id, max(staleness) FROM (
                  SELECT run_id, staleness FROM file_tokens GROUP BY ALL
                  HAVING sum(n_prox) >= {literal(min_tokens)})
              GROUP BY run_id"""
    return dict(con.execute(sql).fetchall())


def minibatches(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Each run's number of PPO minibatches per step (the largest `minibatch` index stored, plus one)."""
    return dict(
        con.execute("SELECT run_id, max(minibatch) + 1 FROM file_sequences GROUP BY run_id").fetchall()
    )
