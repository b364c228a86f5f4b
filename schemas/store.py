"""The metrics store (DuckDB): its DDL and the vocabulary of its public views (DOMAIN.md sections 2, 3, 7)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files

STORE_SCHEMA_VERSION = "3"

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


@dataclass(frozen=True)
class Metric:
    """A per-token metric (DOMAIN.md sections 3 and 3b): `a` = the method's estimate of log pi_prox, `g` =
    `prox_logp`, `b` = `behave_logp`, `t` = `theta_logp`; `w(d)` = exp(min(d, 150)); `clip`, `bound` and `W`
    the loss's decisions and gradient weight. `evaluator.formulas.metrics` computes each by this name."""

    name: str
    formula: str
    needs_truth: bool
    """counted only on tokens with `prox_logp`; the others on every token where the estimate exists"""
    of: str = "all"
    """the methods that have it: `all`, the `estimators` (for the ground truth it is 0), or `ground_truth`"""
    binary: bool = False
    """a 0/1 value: its mean is a rate, and it keeps no quantile sketch (its quantiles say nothing)"""


# The one definition of the metrics: the docs' table and the formulas follow it (tests check both).
METRIC_TABLE: tuple[Metric, ...] = (
    Metric("approx_logp", "a", False),
    Metric("abs_error", "abs(a - g)", True),
    Metric("rel_error", "abs(a - g) / (abs(g) + 1e-8)", True),
    Metric("squared_error", "(a - g)^2", True),
    Metric("behave_imp_weight", "w(a - b)", False),
    Metric("behave_imp_weight_abs_error", "abs(w(a - b) - w(g - b))", True),
    Metric("behave_imp_weight_rel_error", "abs(w(a - b) - w(g - b)) / (w(g - b) + 1e-8)", True),
    Metric("importance_weight", "w(t - a)", False),
    Metric("importance_weight_abs_error", "abs(w(t - a) - w(t - g))", True),
    Metric("importance_weight_rel_error", "abs(w(t - a) - w(t - g)) / (w(t - g) + 1e-8)", True),
    Metric("behave_approx_kl", "a - b", False),
    Metric("clip_active", "clip(a)", True, binary=True),
    Metric("clip_flip", "clip(a) != clip(g)", True, "estimators", binary=True),
    Metric("bound_active", "bound(a)", True, binary=True),
    Metric("bound_flip", "bound(a) != bound(g)", True, "estimators", binary=True),
    Metric("grad_weight", "W(a)", True),
    Metric("grad_weight_abs_error", "abs(W(a) - W(g))", True, "estimators"),
    Metric("drift", "abs(g - b)", True, "ground_truth"),
    Metric("prob_drift", "abs(exp(g) - exp(b))", True, "ground_truth"),
    Metric("exp_abs_drift", "w(abs(g - b))", True, "ground_truth"),
)
METRICS: tuple[str, ...] = tuple(m.name for m in METRIC_TABLE)
TRUTH_ONLY_METRICS = tuple(m.name for m in METRIC_TABLE if m.of == "ground_truth")
ESTIMATOR_ONLY_METRICS = tuple(m.name for m in METRIC_TABLE if m.of == "estimators")


def metrics_for(method: str) -> tuple[Metric, ...]:
    """The metrics reported for `method`."""
    kind = "ground_truth" if method == "ground_truth" else "estimators"
    return tuple(m for m in METRIC_TABLE if m.of in ("all", kind))


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
# The public views of views.sql, a stable interface, with their columns (a test checks them).
PUBLIC_VIEWS: dict[str, tuple[str, ...]] = {
    "run_summary": ("run_id", "method", "metric", *STATS),
    "staleness_summary": ("run_id", "staleness", "method", "metric", *STATS),
    "step_summary": ("run_id", "step", "method", "metric", *STATS),
    "step_staleness_summary": ("run_id", "step", "staleness", "method", "metric", "n", "mean", "min", "max"),
    "pairing_summary": (
        "run_id",
        "interpolation",
        "n",
        "own_abs_error",
        "shipped_abs_error",
        "shipped_over_own",
    ),
    "decision_summary": ("run_id", *DECISION_COLUMNS),
    "decision_staleness_summary": ("run_id", "staleness", *DECISION_COLUMNS),
    "weight_summary": ("run_id", *WEIGHT_COLUMNS),
    "weight_staleness_summary": ("run_id", "staleness", *WEIGHT_COLUMNS),
    "mismatch_summary": ("run_id", "staleness", "n", "drift", "prob_drift", "exp_abs_drift", "floor_share"),
    "run_findings": ("run_id", "rule", "column_name", "n_rows", "message", "found_at"),
}


@dataclass(frozen=True)
class Tolerance:
    """The safe staleness's tolerance (DOMAIN.md 3b defaults, the macro's too)."""

    max_gradient_mass_error: float = 0.01
    max_clip_flip_rate: float = 0.01
    min_tokens: int = 1000
    """a staleness with fewer tokens is not judged"""

    SQL = "safe_staleness(max_gradient_mass_error := ?, max_clip_flip_rate := ?, min_tokens := ?)"
    """The call of the table macro `safe_staleness`, with `values()` as its parameters."""

    def values(self) -> list[float | int]:
        return [float(self.max_gradient_mass_error), float(self.max_clip_flip_rate), int(self.min_tokens)]


DEFAULT_TOLERANCE = Tolerance()

TABLE_DDL: str = (files("schemas") / "store.sql").read_text()
"""The tables (idempotent)."""
VIEWS_DDL: str = (files("schemas") / "views.sql").read_text()
"""The macros and views, every statement a CREATE OR REPLACE."""
STORE_DDL: str = TABLE_DDL + VIEWS_DDL
"""What a writer runs on every open of its working copy."""
