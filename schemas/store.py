"""The metrics store (a DuckLake): its DDL and the vocabulary of its public views (DOMAIN.md sections 2, 3, 7,
8)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files

from schemas.figures import EXCESS, EXCESS_FIGURES, INTERVAL_FIGURES, bounds, with_bounds

STORE_SCHEMA_VERSION = "9"

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
    "reuse_train_logp",
    "proximal_t",
)


@dataclass(frozen=True)
class Metric:
    """A metric (DOMAIN.md sections 3, 3b and 3c): `a` = the method's estimate of log pi_prox, `g` =
    `prox_logp`, `b` = `behave_logp`, `t` = `theta_logp`; `w(d)` = exp(min(d, 150)); `C`, `D`, `bound`,
    `below` and `W` the loss's decisions and gradient weight (`evaluator.formulas.gradients`).
    `evaluator.formulas.metrics` computes each by this name."""

    name: str
    formula: str
    needs_truth: bool
    """counted only where `prox_logp` is known; the others wherever the estimate exists"""
    of: str = "all"
    """the methods that have it: `all`, the `estimators` (for the ground truth it is 0), or `ground_truth`"""
    binary: bool = False
    """a 0/1 value: its mean is a rate, its quantiles follow from the mean (no sketch is kept)"""
    sketch: bool = True
    """keep a quantile sketch (binary metrics never do)"""
    per: str = "token"
    """`token`: one value per loss token; `sequence`: one per sequence (run_id, seq_id, minibatch), counted
    at the staleness of its stalest token"""
    when: str | None = None
    """the loss property it needs (`evaluator.formulas.loss.Loss`): a loss without that decision has none"""
    by_sequence: bool = False
    """a token metric whose value depends on its sequence's other tokens (per-sequence metrics all do)"""


def _flag(name: str, formula: str, of: str = "all", **keys) -> Metric:
    return Metric(name, formula, True, of, binary=True, sketch=False, **keys)


VERL_T = 2.0
"""verl's rollout_is_threshold default: its diagnostics clamp or compare the weights at [1/T, T]."""


VERL_SEQUENCE_K: tuple[tuple[str, str], ...] = tuple(
    (k, agg) for k in ("k1", "k2", "k3") for agg in ("sum", "mean", "max") if (k, agg) != ("k1", "max")
)
"""verl's per-response k statistics: (k, how it is aggregated over the response); verl has no max of k1."""
_K_FORMULAS = {"k1": "(b - a)", "k2": "d^2 / 2", "k3": "(exp(d) - 1 - d)"}


def _verl(
    name: str, formula: str, per: str = "token", binary: bool = False, by_sequence: bool = False
) -> Metric:
    return Metric(name, formula, False, binary=binary, sketch=False, per=per, by_sequence=by_sequence)


# verl's rollout-correction diagnostics (`verl/trainer/ppo/rollout_corr_helper.py` and
# `verl/utils/debug/metrics.py` at verl-project/verl 1dda039), with a - b as verl's log ratio of the training
# policy to the rollout's, d = clamp(a - b, -20, 20) its safety bound.
VERL_DIAGNOSTICS: tuple[Metric, ...] = (
    _verl("is_weight", "exp(d)"),
    _verl("is_weight_truncated", "min(exp(d), T)"),
    _verl(
        "is_seq_weight_truncated",
        "min(exp(clamp(sum_S (a - b), -20, 20)), T) on each token of S",
        by_sequence=True,
    ),
    _verl("prob_diff", "abs(exp(a) - exp(b))"),
    _verl("is_weight_high", "exp(d) > T", binary=True),
    _verl("is_weight_low", "exp(d) < 1/T", binary=True),
    _verl("approx_prob", "exp(a)"),
    _verl("behave_prob", "exp(b)"),
    _verl("prob_product", "exp(a) exp(b)"),
    _verl("seq_is_weight", "exp(clamp(sum_S (a - b), -20, 20))", "sequence"),
    _verl("seq_geo_weight", "exp(mean_S (a - b))", "sequence"),
    _verl("seq_is_weight_low", "sum_S (a - b) < -log T", "sequence", binary=True),
    _verl("seq_is_weight_high", "sum_S (a - b) > log T", "sequence", binary=True),
    _verl("seq_log_ratio", "sum_S (a - b)", "sequence"),
    _verl("seq_is_weight_truncated", "min(exp(clamp(sum_S (a - b), -20, 20)), T)", "sequence"),
    _verl("seq_token_weight_mean", "mean_S min(exp(d), T)", "sequence"),
    _verl("seq_token_weight_high", "mean_S exp(d) > T", "sequence", binary=True),
    _verl("seq_token_weight_low", "mean_S exp(d) < 1/T", "sequence", binary=True),
    _verl("seq_log_ppl", "-mean_S a", "sequence"),
    _verl("seq_ppl", "w(-mean_S a)", "sequence"),
    _verl("seq_behave_log_ppl", "-mean_S b", "sequence"),
    _verl("seq_behave_ppl", "w(-mean_S b)", "sequence"),
    _verl("seq_token_outside", "a token of S with exp(d) outside [1/T, T]", "sequence", binary=True),
    _verl("seq_log_ppl_diff", "mean_S (b - a)", "sequence"),
    _verl("seq_log_ppl_abs_diff", "abs(mean_S (b - a))", "sequence"),
    _verl("seq_ppl_ratio", "exp(mean_S (b - a))", "sequence"),
    *(_verl(f"seq_{k}_{agg}", f"{agg}_S {_K_FORMULAS[k]}", "sequence") for k, agg in VERL_SEQUENCE_K),
)
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
    _flag("clip_active", "C(a)", when="has_clip"),
    _flag("clip_flip", "C(a) != C(g)", "estimators", when="has_clip"),
    _flag("dual_clip_active", "D(a)", when="has_dual_clip"),
    _flag("dual_clip_flip", "D(a) != D(g)", "estimators", when="has_dual_clip"),
    _flag("bound_active", "bound(a)", when="has_rules"),
    _flag("bound_flip", "bound(a) != bound(g)", "estimators", when="has_rules"),
    _flag("bound_lower_flip", "below(a) != below(g)", "estimators", when="has_lower_bound"),
    Metric("grad_weight", "W(a)", True),
    Metric("grad_weight_abs_error", "abs(W(a) - W(g))", True, "estimators"),
    Metric("true_grad_weight", "W(g)", True, "estimators", sketch=False),
    Metric("drift", "abs(g - b)", True, "ground_truth"),
    Metric("prob_drift", "abs(exp(g) - exp(b))", True, "ground_truth"),
    Metric("exp_abs_drift", "w(abs(g - b))", True, "ground_truth"),
    Metric("seq_drift", "mean_S abs(g - b)", True, "ground_truth", sketch=False, per="sequence"),
    _flag("sequence_clip_active", "C(s(a))", per="sequence", when="has_sequence_clip"),
    _flag("sequence_clip_flip", "C(s(a)) != C(s(g))", "estimators", per="sequence", when="has_sequence_clip"),
    _flag(
        "sequence_bound_active", "bound(a) on a token of the sequence", per="sequence", when="sequence_rules"
    ),
    _flag(
        "sequence_bound_flip",
        "sequence_bound_active(a) != sequence_bound_active(g)",
        "estimators",
        per="sequence",
        when="sequence_rules",
    ),
    *VERL_DIAGNOSTICS,
)
METRICS: tuple[str, ...] = tuple(m.name for m in METRIC_TABLE)
TRUTH_ONLY_METRICS = tuple(m.name for m in METRIC_TABLE if m.of == "ground_truth")
ESTIMATOR_ONLY_METRICS = tuple(m.name for m in METRIC_TABLE if m.of == "estimators")


def metrics_for(method: str, loss: object | None = None) -> tuple[Metric, ...]:
    """The metrics reported for `method` under `loss` (an `evaluator.formulas.loss.Loss`: a metric whose
    decision the loss does not have is left out); every metric any loss has for None."""
    kind = "ground_truth" if method == "ground_truth" else "estimators"
    return tuple(
        m
        for m in METRIC_TABLE
        if m.of in ("all", kind) and (m.when is None or loss is None or getattr(loss, m.when))
    )


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
    "dual_clip_flip_rate",
    "bound_lower_flip_rate",
    "n_sequences",
    "sequence_clip_flip_rate",
    "sequence_bound_flip_rate",
    "grad_weight_abs_error",
    "true_grad_weight",
    "n_steps",
    *(column for f in INTERVAL_FIGURES for column in bounds(f)),
    *(column for f in EXCESS_FIGURES for column in with_bounds(EXCESS + f)),
)
FLOOR_COLUMNS = (*EXCESS_FIGURES, "prob_drift", "exp_abs_drift")
"""The figures of the view `engine_floor` (each with its interval): the engine floor's decision figures
and the drift at staleness 0."""
WEIGHT_COLUMNS = ("method", "n", "ess_fraction", "chi2", "kl_k1", "kl_k2", "kl_k3")
ROLLOUT_CORR_COLUMNS = (
    "method", "rollout_is", "n", "n_sequences",
    *(f"rollout_is_{key}" for key in (
        "mean", "std", "eff_sample_size", "max", "min", "ratio_fraction_high", "ratio_fraction_low",
        "seq_mean", "seq_std", "seq_max", "seq_min", "seq_max_deviation", "seq_fraction_high",
        "seq_fraction_low", "batch_norm_factor",
    )),
    "training_ppl", "training_log_ppl", "rollout_ppl", "rollout_log_ppl", "kl", "k3_kl", "log_ppl_diff",
    "log_ppl_abs_diff", "log_ppl_diff_max", "log_ppl_diff_min", "ppl_ratio", "chi2_token", "chi2_seq",
    "seq_is_ess_fraction", "seq_geo_weight_mean", "seq_geo_ess_fraction",
    "rollout_rs_token_k1_seq_masked_fraction", "rollout_probs_diff_mean", "rollout_probs_diff_max",
    "rollout_probs_diff_std", "rollout_actor_probs_pearson_corr",
    *(f"rollout_rs_seq_{agg}_{k}_{stat}" for k, agg in VERL_SEQUENCE_K
      for stat in ("seq_mean", "seq_std", "seq_max", "seq_min", "seq_max_deviation", "max", "min")),
)  # fmt: skip
"""verl's names (its `rollout_corr/` keys without the prefix), with verl's definitions."""
# The public views of views.sql, a stable interface, with their columns (a test checks them).
PUBLIC_VIEWS: dict[str, tuple[str, ...]] = {
    "run_summary": ("run_id", "method", "metric", *STATS, *bounds("mean")),
    "staleness_summary": ("run_id", "staleness", "method", "metric", *STATS, *bounds("mean")),
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
    "rollout_corr_summary": ("run_id", *ROLLOUT_CORR_COLUMNS),
    "rollout_corr_staleness_summary": ("run_id", "staleness", *ROLLOUT_CORR_COLUMNS),
    "mismatch_summary": ("run_id", "staleness", "n", "drift", "prob_drift", "exp_abs_drift", "floor_share"),
    "engine_floor": (
        "run_id",
        "n",
        "n_steps",
        *(column for f in FLOOR_COLUMNS for column in with_bounds(f)),
    ),
    "run_findings": ("run_id", "rule", "column_name", "n_rows", "message", "found_at"),
    "trainer_mismatch": (
        "run_id",
        "trainer",
        "metric",
        "value",
        "line",
        "within_line",
        "n",
        "definition",
        "source",
    ),
}


@dataclass(frozen=True)
class Tolerance:
    """The safe staleness's tolerance (DOMAIN.md 3b defaults, the macro's too)."""

    max_gradient_mass_error: float = 0.01
    max_clip_flip_rate: float = 0.01
    min_tokens: int = 1000
    """a staleness with fewer tokens is not judged"""

    SQL = "safe_staleness(max_gradient_mass_error := {}, max_clip_flip_rate := {}, min_tokens := {})"
    """The call of the table macro `safe_staleness`: `values()`, as SQL literals, in its places."""

    def values(self) -> list[float | int]:
        return [float(self.max_gradient_mass_error), float(self.max_clip_flip_rate), int(self.min_tokens)]


DEFAULT_TOLERANCE = Tolerance()

TABLE_DDL: str = (files("schemas") / "store.sql").read_text()
"""The tables (idempotent)."""
VIEWS_DDL: str = (files("schemas") / "views.sql").read_text()
"""The macros and views, every statement a CREATE OR REPLACE."""
STORE_DDL: str = TABLE_DDL + VIEWS_DDL
"""What a writer runs on every open of its working copy."""
