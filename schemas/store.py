"""The metrics store (DuckDB): its DDL and the vocabulary of its public views (DOMAIN.md sections 2, 3, 7)."""

from __future__ import annotations

from importlib.resources import files

STORE_SCHEMA_VERSION = "1"
STORE_DDL: str = (files("schemas") / "store.sql").read_text()

# Estimators of log pi_prox, plus the ground truth itself (DOMAIN.md section 2).
METHODS: tuple[str, ...] = (
    "ground_truth",
    "loglinear",
    "linear",
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
