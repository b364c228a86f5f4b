"""The metrics store (DuckDB): its DDL and the vocabulary of its public views (DOMAIN.md sections 2, 3, 7)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources import files

STORE_SCHEMA_VERSION = "4"

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

# Metric names (DOMAIN.md sections 3 and 3b); formulas and which methods have them live in
# evaluator/formulas/metrics.py.
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
    "behave_approx_kl",
    "clip_active",
    "clip_flip",
    "bound_active",
    "bound_flip",
    "grad_weight",
    "grad_weight_abs_error",
    "drift",
    "prob_drift",
    "exp_abs_drift",
)
TRUTH_ONLY_METRICS = ("drift", "prob_drift", "exp_abs_drift")
ESTIMATOR_ONLY_METRICS = ("clip_flip", "bound_flip", "grad_weight_abs_error")

# Figures derived from the exact sums of several metrics (DOMAIN.md 3b), per run and staleness range:
# what `decision_*` and `weight_*` views report, and what the gate can judge besides a metric's stat.
FIGURES: dict[str, str] = {
    "gradient_mass_error": "sum grad_weight_abs_error / the ground truth's sum grad_weight",
    "clip_flip_rate": "mean clip_flip",
    "bound_flip_rate": "mean bound_flip",
    "ess_fraction": "(sum w)^2 / (n sum w^2) of w = behave_imp_weight",
    "chi2": "n sum w^2 / (sum w)^2 - 1 of w = behave_imp_weight",
    "kl_k1": "mean -r of r = behave_approx_kl",
    "kl_k2": "mean r^2 / 2",
    "kl_k3": "mean exp(r) - 1 - r",
    "safe_staleness": "the largest staleness s such that every staleness <= s with enough tokens meets the "
    "tolerance",
    "warnings": "the number of data-driven warnings stored with the run (`run_findings`); no method",
}
ESTIMATOR_FIGURES = ("gradient_mass_error", "clip_flip_rate", "bound_flip_rate", "safe_staleness")
RUN_FIGURES = ("warnings",)
"""Figures of a whole run, judged without a method."""

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
    "mismatch_summary": ("run_id", "staleness", "n", "drift", "prob_drift", "exp_abs_drift", "floor_share"),
    "run_findings": ("run_id", "rule", "column_name", "n_rows", "message", "found_at"),
}

QUANTILES: dict[str, float] = {"p50": 0.50, "p90": 0.90, "p99": 0.99}


def summary_sql(keys: Sequence[str], sketch_table: str, where: str = "TRUE") -> str:
    """A query of `keys..., n, mean, min, max, p50, p90, p99` over the rows of the store that pass
    `where` (SQL on the tables' columns), merged over every other column.

    n, mean, min, max come from the exact moments (`metric_moments`). Quantiles (null for the 0/1 metrics,
    which keep no sketch) merge the bucket counts of
    `sketch_table` (`sketch_by_staleness` or `sketch_by_step`): the q-quantile is the representative value
    of the first bucket, in value order, whose cumulative count exceeds the rank q * (n - 1), clamped to
    the exact [min, max] (DDSketch's rule; `evaluator.formulas.sketch.sketch_quantile` is the numpy twin).
    The public views and the gate's staleness-range checks all use this one query."""
    k = ", ".join(keys)
    r_keys, m_keys = (", ".join(f"{alias}.{key}" for key in keys) for alias in ("r", "m"))
    ranks = ",\n           ".join(
        f"min(r.bucket) FILTER (WHERE r.cum > {q:.2f} * (m.n - 1)) AS b_{name}"
        for name, q in QUANTILES.items()
    )
    values = ",\n       ".join(
        f"CASE WHEN q.b_{name} IS NOT NULL  -- greatest() and least() would skip a null\n"
        f"            THEN least(greatest(proxaudit_bucket_value(q.b_{name}), m.min), m.max) END AS {name}"
        for name in QUANTILES
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
FROM moments m LEFT JOIN quantiles q USING ({k})"""


def decision_sql(keys: Sequence[str], where: str = "TRUE") -> str:
    """Per `keys` and estimator: the decision figures of DOMAIN.md 3b from the exact sums. n: tokens with
    the ground truth; gradient_mass_error = sum grad_weight_abs_error / the ground truth's sum grad_weight
    on the same cells; the flip and active rates are means of the 0/1 metrics; true_*_rate are the ground
    truth's own clip and bound rates."""
    k = ", ".join(keys)
    rate = "sum(sum) FILTER (WHERE metric = '{0}') / sum(n) FILTER (WHERE metric = '{0}')"
    return f"""
WITH sums AS (
    SELECT {k}, method,
           coalesce(sum(n) FILTER (WHERE metric = 'grad_weight_abs_error'),
                    sum(n) FILTER (WHERE metric = 'grad_weight'))::BIGINT AS n,
           sum(sum) FILTER (WHERE metric = 'grad_weight') AS grad_weight,
           sum(sum) FILTER (WHERE metric = 'grad_weight_abs_error') AS grad_weight_abs_error,
           {rate.format("clip_flip")} AS clip_flip_rate,
           {rate.format("bound_flip")} AS bound_flip_rate,
           {rate.format("clip_active")} AS clip_active_rate,
           {rate.format("bound_active")} AS bound_active_rate
    FROM metric_moments
    WHERE metric IN ('grad_weight', 'grad_weight_abs_error', 'clip_flip', 'bound_flip', 'clip_active',
                     'bound_active') AND {where}
    GROUP BY {k}, method
)
SELECT {", ".join(f"e.{key}" for key in keys)}, e.method, e.n,
       e.grad_weight_abs_error / nullif(t.grad_weight, 0) AS gradient_mass_error,
       e.clip_flip_rate, e.bound_flip_rate, e.clip_active_rate, e.bound_active_rate,
       t.clip_active_rate AS true_clip_active_rate, t.bound_active_rate AS true_bound_active_rate
FROM sums e JOIN sums t ON {" AND ".join(f"e.{key} = t.{key}" for key in keys)} AND t.method = 'ground_truth'
WHERE e.method <> 'ground_truth'"""


def weight_sql(keys: Sequence[str], where: str = "TRUE") -> str:
    """Per `keys` and method (the ground truth too): weight diagnostics of DOMAIN.md 3b from the exact sums
    of w = behave_imp_weight and r = behave_approx_kl = log w: ess_fraction = (sum w)^2 / (n sum w^2),
    chi2 = n sum w^2 / (sum w)^2 - 1, and the KL estimators' means k1 = -r, k2 = r^2 / 2, k3 = w - 1 - r."""
    k = ", ".join(keys)
    return f"""
WITH sums AS (
    SELECT {k}, method,
           sum(n) FILTER (WHERE metric = 'behave_imp_weight')::BIGINT AS n,
           sum(sum) FILTER (WHERE metric = 'behave_imp_weight') AS w,
           sum(sum_sq) FILTER (WHERE metric = 'behave_imp_weight') AS w2,
           sum(sum) FILTER (WHERE metric = 'behave_approx_kl') AS r,
           sum(sum_sq) FILTER (WHERE metric = 'behave_approx_kl') AS r2
    FROM metric_moments WHERE metric IN ('behave_imp_weight', 'behave_approx_kl') AND {where}
    GROUP BY {k}, method
)
SELECT {k}, method, n,
       w * w / nullif(n * w2, 0) AS ess_fraction,
       n * w2 / nullif(w * w, 0) - 1 AS chi2,
       (0 - r) / n AS kl_k1,  -- not -r: a -0.0 when r is 0
       r2 / (2 * n) AS kl_k2,
       (w - r) / n - 1 AS kl_k3
FROM sums"""


DERIVED_VIEWS: dict[str, tuple[str, ...]] = {
    "decision_summary": ("run_id",),
    "decision_staleness_summary": ("run_id", "staleness"),
    "weight_summary": ("run_id",),
    "weight_staleness_summary": ("run_id", "staleness"),
}
DECISION_COLUMNS = (
    "method",
    "n",
    "gradient_mass_error",
    "clip_flip_rate",
    "bound_flip_rate",
    "clip_active_rate",
    "bound_active_rate",
    "true_clip_active_rate",
    "true_bound_active_rate",
)
WEIGHT_COLUMNS = ("method", "n", "ess_fraction", "chi2", "kl_k1", "kl_k2", "kl_k3")
OTHER_PUBLIC_VIEWS |= {
    view: (*keys, *(DECISION_COLUMNS if view.startswith("decision") else WEIGHT_COLUMNS))
    for view, keys in DERIVED_VIEWS.items()
}


@dataclass(frozen=True)
class Tolerance:
    """The safe staleness's tolerance (DOMAIN.md 3b defaults, the macro's too)."""

    max_gradient_mass_error: float = 0.01
    max_clip_flip_rate: float = 0.01
    min_tokens: int = 1000
    """a staleness with fewer tokens is not judged"""

    def sql(self) -> str:
        """The call of the table macro `safe_staleness` with this tolerance."""
        return (
            f"safe_staleness(max_gradient_mass_error := {float(self.max_gradient_mass_error)!r}, "
            f"max_clip_flip_rate := {float(self.max_clip_flip_rate)!r}, min_tokens := {int(self.min_tokens)})"
        )


# The safe staleness (DOMAIN.md 3b) for a tolerance: the largest staleness s such that every staleness
# <= s with at least min_tokens tokens has gradient_mass_error <= max_gradient_mass_error and
# clip_flip_rate <= max_clip_flip_rate; -1 when staleness 0 already fails; with no failure, the largest
# staleness measured with enough tokens; null when no staleness has enough tokens.
DEFAULT_TOLERANCE = _T = Tolerance()
SAFE_STALENESS_MACRO = f"""
CREATE OR REPLACE MACRO safe_staleness(max_gradient_mass_error := {_T.max_gradient_mass_error},
                                       max_clip_flip_rate := {_T.max_clip_flip_rate},
                                       min_tokens := {_T.min_tokens}) AS TABLE
WITH levels AS (
    SELECT run_id, method, staleness, n >= min_tokens AS enough,
           coalesce(gradient_mass_error <= max_gradient_mass_error AND clip_flip_rate <= max_clip_flip_rate,
                    false) AS ok
    FROM decision_staleness_summary
)
SELECT run_id, method,
       CASE WHEN NOT bool_or(enough) THEN NULL
            ELSE coalesce(min(staleness) FILTER (WHERE enough AND NOT ok) - 1,
                          max(staleness) FILTER (WHERE enough)) END::INTEGER AS safe_staleness,
       count(*) FILTER (WHERE enough)::INTEGER AS measured_levels
FROM levels GROUP BY run_id, method;
"""


def _public_views() -> str:
    sketch_of = {
        "run_summary": "sketch_by_staleness",
        "staleness_summary": "sketch_by_staleness",
        "step_summary": "sketch_by_step",
    }
    views = [
        f"CREATE OR REPLACE VIEW {view} AS {summary_sql(columns[: -len(STATS)], sketch_of[view])};\n"
        for view, columns in PUBLIC_VIEWS.items()
    ]
    views += [
        f"CREATE OR REPLACE VIEW {view} AS "
        f"{(decision_sql if view.startswith('decision') else weight_sql)(keys)};\n"
        for view, keys in DERIVED_VIEWS.items()
    ]
    return "".join(views) + SAFE_STALENESS_MACRO


TABLE_DDL: str = (files("schemas") / "store.sql").read_text()
"""The tables (idempotent)."""
VIEWS_DDL: str = (files("schemas") / "views.sql").read_text() + _public_views()
"""The macros and views, every statement a CREATE OR REPLACE."""
STORE_DDL: str = TABLE_DDL + VIEWS_DDL
"""What a writer runs on every open of its working copy."""
TEMP_VIEWS_DDL: str = VIEWS_DDL.replace("CREATE OR REPLACE VIEW", "CREATE OR REPLACE TEMP VIEW").replace(
    "CREATE OR REPLACE MACRO", "CREATE OR REPLACE TEMP MACRO"
)
"""What a reader runs: proxaudit's views and macros as temporary objects, which shadow the file's own."""
