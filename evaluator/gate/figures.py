"""What the gate judges, read from the store: a metric's statistics over a staleness range, or a derived
figure (decision figures and their excess over the engine floor, weight diagnostics, the safe staleness,
the floor itself, the run's warnings), each with its 95% interval where it has one
(`evaluator.store.intervals`). `evaluator.gate.judge` turns them into verdicts."""

from __future__ import annotations

import duckdb

from evaluator.store.intervals import MEAN_METRICS, selection_interval
from schemas.store import EXCESS_FIGURES, INTERVAL_FIGURES, STATS
from schemas.thresholds import SAFE_STALENESS_FIGURES, Check

# n, mean, min, max and p50/p90/p99 per run over a staleness range, by the macro of the public views (with
# the full range it is `run_summary`, with one staleness `staleness_summary`).
_SELECTION_SQL = f"""
    SELECT run_id, {", ".join(STATS)} FROM summary_over(lo := $lo, hi := $hi)
    WHERE method = $method AND metric = $metric"""
_ALL_STALENESS = (-(2**31), 2**31 - 1)
_FIGURE_SQL = {
    kind: f"SELECT * FROM {kind}_over(lo := $lo, hi := $hi) WHERE method = $method"
    for kind in ("decision", "weight")
}
_SAFE_STALENESS_SQL = """
    SELECT s.run_id, s.{figure}, s.{figure}_lower, s.{figure}_upper,
           (SELECT coalesce(sum(d.n), 0) FROM decision_staleness_summary d
            WHERE d.run_id = s.run_id AND d.method = s.method AND d.n >= $min_tokens) AS n
    FROM safe_staleness(max_gradient_mass_error := $max_gme, max_clip_flip_rate := $max_flip,
                        min_tokens := $min_tokens) s
    WHERE s.method = $method"""
_FLOOR_SQL = """SELECT run_id, n, n_steps, {name}, {name}_lower, {name}_upper FROM engine_floor"""
# The metric whose rows a figure needs: a run without them is missing the figure.
FIGURE_METRIC = {
    **{f: f.removesuffix("_rate") for f in INTERVAL_FIGURES},
    **{f"excess_{f}": f.removesuffix("_rate") for f in EXCESS_FIGURES},
    **dict.fromkeys(
        (
            "gradient_mass_error",
            "excess_gradient_mass_error",
            "safe_staleness",
            "safe_staleness_beyond_floor",
        ),
        "grad_weight_abs_error",
    ),
    **dict.fromkeys(("ess_fraction", "chi2", "kl_k1", "kl_k2", "kl_k3"), "behave_imp_weight"),
}


def selection_stats(
    con: duckdb.DuckDBPyConnection, method: str, metric: str, staleness: tuple[int, int] | None = None
) -> dict[str, dict[str, float]]:
    """`{run_id: {n, mean, min, max, p50, p90, p99}}` over the tokens with staleness in `[lo, hi]`
    (every token if None), with the mean's 95% interval (`lower`, `upper`) where the store keeps one for the
    metric; runs without such tokens are absent."""
    lo, hi = staleness if staleness is not None else _ALL_STALENESS
    params = {"method": method, "metric": metric, "lo": lo, "hi": hi}
    rows = con.execute(_SELECTION_SQL, params).fetchall()
    stats = {row[0]: dict(zip(STATS, row[1:], strict=True)) for row in rows}
    if metric in MEAN_METRICS:
        stored = {}
        if staleness is None:  # the whole run: the interval the store keeps (the same draws)
            sql = _STORED_MEAN_SQL
            stored = {r[0]: r[1:] for r in con.execute(sql, [method, metric]).fetchall()}
        for run_id, values in stats.items():
            values["mean_lower"], values["mean_upper"], values["steps"] = stored.get(run_id) or (
                selection_interval(con, run_id, f"mean:{metric}", method, lo, hi)
            )
    return stats


_STORED_MEAN_SQL = """
    SELECT i.run_id, i.lower, i.upper, d.n_steps FROM mean_interval i
    JOIN (SELECT run_id, max(n_steps) AS n_steps FROM decision_interval GROUP BY run_id) d USING (run_id)
    WHERE i.staleness IS NULL AND i.method = ? AND i.metric = ?"""


_WARNINGS_SQL = """
    SELECT run_id, sum(n_tokens)::BIGINT AS n,
           (SELECT count(*) FROM run_finding f WHERE f.run_id = t.run_id) AS warnings
    FROM file_tokens t GROUP BY run_id"""


def figure_stats(con: duckdb.DuckDBPyConnection, check: Check) -> dict[str, dict[str, float]]:
    """`{run_id: {"n": tokens, figure: value, "lower", "upper", "steps"}}` of the check's derived figure
    over its staleness range (every token if None), from the exact sums, with its 95% interval where it has
    one. For the safe staleness: the tokens of the staleness levels with at least `min_tokens` tokens (0
    when none has enough), its bounds from the intervals; for the engine floor: its tokens at staleness 0;
    for warnings: the run's tokens."""
    figure = check.figure
    if figure == "warnings":
        return {run: {"n": n, "warnings": count} for run, n, count in con.execute(_WARNINGS_SQL).fetchall()}
    if figure in SAFE_STALENESS_FIGURES:
        params = {
            "method": check.method,
            "max_gme": check.max_gradient_mass_error,
            "max_flip": check.max_clip_flip_rate,
            "min_tokens": check.min_tokens,
        }
        rows = con.execute(_SAFE_STALENESS_SQL.format(figure=figure), params).fetchall()
        return {
            run: {"n": n, figure: v, f"{figure}_lower": lo, f"{figure}_upper": hi}
            for run, v, lo, hi, n in rows
        }
    if figure.startswith("floor_"):
        rows = con.execute(_FLOOR_SQL.format(name=figure.removeprefix("floor_"))).fetchall()
        return {
            run: {"n": n, figure: v, f"{figure}_lower": lo, f"{figure}_upper": hi, "steps": steps}
            for run, n, steps, v, lo, hi in rows
        }
    lo, hi = check.staleness if check.staleness is not None else _ALL_STALENESS
    base = figure.removeprefix("excess_")
    kind = "weight" if FIGURE_METRIC[figure] == "behave_imp_weight" else "decision"
    if kind == "decision" and check.staleness is None:  # the whole run: the view has its intervals
        return _stored_figure(con, figure, check.method)
    cursor = con.execute(_FIGURE_SQL[kind], {"method": check.method, "lo": lo, "hi": hi})
    names = [d[0] for d in cursor.description]
    rows = [dict(zip(names, values, strict=True)) for values in cursor.fetchall()]  # before other queries
    floors = _floor_points(con, base) if figure.startswith("excess_") else {}
    out = {}
    for row in rows:
        value = row[base]
        if figure.startswith("excess_"):
            floor = floors.get(row["run_id"])
            value = None if value is None or floor is None else value - floor
        stats = {"n": row["n"], figure: value}
        if kind == "decision":
            stats[f"{figure}_lower"], stats[f"{figure}_upper"], stats["steps"] = selection_interval(
                con, row["run_id"], figure, check.method, lo, hi
            )
        out[row["run_id"]] = stats
    return out


def _stored_figure(con: duckdb.DuckDBPyConnection, figure: str, method: str) -> dict[str, dict[str, float]]:
    """A decision figure of every run over every staleness, with the interval the store keeps."""
    sql = f"SELECT run_id, n, n_steps, {figure}, {figure}_lower, {figure}_upper FROM decision_summary"
    rows = con.execute(sql + " WHERE method = ?", [method]).fetchall()
    return {
        run: {"n": n, figure: v, f"{figure}_lower": lo, f"{figure}_upper": hi, "steps": steps}
        for run, n, steps, v, lo, hi in rows
    }


def _floor_points(con: duckdb.DuckDBPyConnection, figure: str) -> dict[str, float | None]:
    """Each run's engine floor of a decision figure (`rollout` at staleness 0)."""
    return dict(con.execute(f"SELECT run_id, {figure} FROM engine_floor").fetchall())


def runs_with_metric(con: duckdb.DuckDBPyConnection, method: str, metric: str) -> set[str]:
    sql = "SELECT DISTINCT run_id FROM metric_moments WHERE method = ? AND metric = ? AND n > 0"
    return {row[0] for row in con.execute(sql, [method, metric]).fetchall()}
