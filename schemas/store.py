"""The metrics store (DuckDB): its DDL and the vocabulary of its public views (DOMAIN.md sections 2, 3, 7)."""

from __future__ import annotations

from collections.abc import Sequence
from importlib.resources import files

STORE_SCHEMA_VERSION = "2"

# Estimators of log pi_prox, plus the ground truth itself (DOMAIN.md section 2).
METHODS: tuple[str, ...] = (
    "ground_truth",
    "loglinear",
    "linear",
    "loglinear_shipped",
    "linear_shipped",
    "loglinear_exact",
    "linear_exact",
    "rollout",
    "proximal_t",
)

# Metric names (DOMAIN.md section 3); formulas live in evaluator/metrics.py. `drift` is ground_truth only.
METRICS: tuple[str, ...] = (
    "approx_logp",
    "abs_error",
    "rel_error",
    "squared_error",
    "behave_imp_weight",
    "behave_imp_weight_abs_error",
    "behave_imp_weight_rel_error",
    "importance_weight",
    "importance_weight_abs_error",
    "importance_weight_rel_error",
    "drift",
)

# Summary statistics every view carries for each (method, metric).
STATS: tuple[str, ...] = ("n", "mean", "min", "max", "p50", "p90", "p99")

PUBLIC_VIEWS: dict[str, tuple[str, ...]] = {
    "run_summary": ("run_id", "method", "metric", *STATS),
    "staleness_summary": ("run_id", "staleness", "method", "metric", *STATS),
    "step_summary": ("run_id", "step", "method", "metric", *STATS),
}
# Views of store.sql that are a public interface too, with their columns (a test checks them).
OTHER_PUBLIC_VIEWS: dict[str, tuple[str, ...]] = {
    "step_staleness_summary": ("run_id", "step", "staleness", "method", "metric", "n", "mean", "min", "max"),
    "pairing_summary": (
        "run_id",
        "interpolation",
        "n",
        "own_abs_error",
        "shipped_abs_error",
        "shipped_over_own",
    ),
}

QUANTILES: dict[str, float] = {"p50": 0.50, "p90": 0.90, "p99": 0.99}


def summary_sql(keys: Sequence[str], sketch_table: str, where: str = "TRUE") -> str:
    """A query of `keys..., n, mean, min, max, p50, p90, p99` over the rows of the store that pass
    `where` (SQL on the tables' columns), merged over every other column.

    n, mean, min, max come from the exact moments (`metric_moments`). Quantiles merge the bucket counts of
    `sketch_table` (`sketch_by_staleness` or `sketch_by_step`): the q-quantile is the representative value
    of the first bucket, in value order, whose cumulative count exceeds the rank q * (n - 1), clamped to
    the exact [min, max] (DDSketch's rule; `evaluator.sketch.sketch_quantile` is the numpy twin).
    The public views and the gate's staleness-range checks all use this one query."""
    k = ", ".join(keys)
    r_keys, m_keys = (", ".join(f"{alias}.{key}" for key in keys) for alias in ("r", "m"))
    ranks = ",\n           ".join(
        f"min(r.bucket) FILTER (WHERE r.cum > {q:.2f} * (m.n - 1)) AS b_{name}"
        for name, q in QUANTILES.items()
    )
    values = ",\n       ".join(
        f"least(greatest(proxaudit_bucket_value(q.b_{name}), m.min), m.max) AS {name}" for name in QUANTILES
    )
    return f"""
WITH moments AS (
    SELECT {k}, sum(n)::BIGINT AS n, sum(sum) / sum(n) AS mean, min(min) AS min, max(max) AS max
    FROM metric_moments WHERE {where} GROUP BY {k}
), buckets AS (
    SELECT {k}, bucket, sum(count) AS c
    FROM {sketch_table} WHERE {where} GROUP BY {k}, bucket
), ranked AS (
    SELECT *, sum(c) OVER (PARTITION BY {k} ORDER BY bucket
                           ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cum
    FROM buckets
), quantiles AS (
    SELECT {r_keys},
           {ranks}
    FROM ranked r JOIN moments m USING ({k})
    GROUP BY {r_keys}
)
SELECT {m_keys}, m.n, m.mean, m.min, m.max,
       {values}
FROM moments m JOIN quantiles q USING ({k})"""


def _public_views() -> str:
    sketch_of = {
        "run_summary": "sketch_by_staleness",
        "staleness_summary": "sketch_by_staleness",
        "step_summary": "sketch_by_step",
    }
    return "".join(
        f"CREATE OR REPLACE VIEW {view} AS {summary_sql(columns[: -len(STATS)], sketch_of[view])};\n"
        for view, columns in PUBLIC_VIEWS.items()
    )


# Idempotent DDL, run on every open for writing: the tables and macro of store.sql, then the public views.
STORE_DDL: str = (files("schemas") / "store.sql").read_text() + _public_views()
