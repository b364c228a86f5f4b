"""The metric table of DOMAIN.md section 3: hand-worked values, coverage, and agreement with the store."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from evaluator.formulas.metrics import metric_values
from schemas.store import METRIC_TABLE, metrics_for

DOCS = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


def test_the_docs_table_is_the_metric_table():
    text = DOCS.read_text()
    table = text[text.index("<!-- metric-table -->") : text.index("<!-- /metric-table -->")]
    rows = [[c.strip().strip("`") for c in line.strip("|").split("|")] for line in table.splitlines()[3:]]
    expected = [[m.name, m.formula, "yes" if m.needs_truth else "no", m.of] for m in METRIC_TABLE]
    assert rows == expected


def test_drift_belongs_to_ground_truth_only():
    assert "drift" in {m.name for m in metrics_for("ground_truth")}
    assert "drift" not in {m.name for m in metrics_for("loglinear")}
    # 14 for every method (10 of section 3, behave_approx_kl, clip_active, bound_active, grad_weight)
    # + 3 flips and errors against the truth for the estimators, + 3 drifts for the ground truth
    assert len(metrics_for("linear")) == 17 and len(metrics_for("ground_truth")) == 17


def test_hand_worked_values_on_one_token():
    # a = -1.0, g = -1.2, b = -1.5, t = -0.9, no advantage (two-sided clip, |A| = 1)
    a, g, b, t = -1.0, -1.2, -1.5, -0.9
    out = metric_values("loglinear", a=np.array([a]), b=np.array([b]), t=np.array([t]), g=np.array([g]))
    expected = {
        "approx_logp": -1.0,
        "abs_error": 0.2,
        "rel_error": 0.2 / (1.2 + 1e-8),
        "squared_error": 0.04,
        "behave_imp_weight": math.exp(0.5),
        "behave_imp_weight_abs_error": math.exp(0.5) - math.exp(0.3),
        "behave_imp_weight_rel_error": (math.exp(0.5) - math.exp(0.3)) / (math.exp(0.3) + 1e-8),
        "importance_weight": math.exp(0.1),
        "importance_weight_abs_error": math.exp(0.3) - math.exp(0.1),
        "importance_weight_rel_error": (math.exp(0.3) - math.exp(0.1)) / (math.exp(0.3) + 1e-8),
        "behave_approx_kl": 0.5,
        # estimated ratio exp(t - a) = exp(0.1) = 1.105 is inside [0.8, 1.2]; the true exp(0.3) = 1.35 is not
        "clip_active": 0.0,
        "clip_flip": 1.0,
        # behaviour weights exp(0.5) and exp(0.3), far below U = 5
        "bound_active": 0.0,
        "bound_flip": 0.0,
        # W(a) = exp(t - b) = exp(0.6); the truth is clipped, W(g) = 0
        "grad_weight": math.exp(0.6),
        "grad_weight_abs_error": math.exp(0.6),
    }
    assert set(out) == set(expected)
    for name, value in expected.items():
        assert out[name] == pytest.approx([value], rel=1e-12), name


def test_error_metrics_cover_only_tokens_with_the_ground_truth():
    # three tokens, the middle one without prox_logp: weights count 3, errors count 2
    a, b, t = np.array([-1.0, -2.0, -3.0]), np.array([-1.1, -2.2, -3.3]), np.array([-0.9, -1.8, -2.7])
    g = np.array([-1.05, np.nan, -3.1])
    out = metric_values("linear", a=a, b=b, t=t, g=g)
    assert len(out["approx_logp"]) == len(out["behave_imp_weight"]) == len(out["importance_weight"]) == 3
    np.testing.assert_allclose(out["abs_error"], [0.05, 0.1], rtol=1e-12)
    np.testing.assert_allclose(out["importance_weight"], np.exp(t - a))


def test_ground_truth_is_exact_and_reports_drift():
    g, b, t = np.array([-1.0, -0.5]), np.array([-1.25, -0.25]), np.array([-0.9, -0.6])
    out = metric_values("ground_truth", a=g, b=b, t=t, g=g)
    for name in ("abs_error", "rel_error", "squared_error", "behave_imp_weight_abs_error"):
        np.testing.assert_array_equal(out[name], [0.0, 0.0])
    np.testing.assert_allclose(out["drift"], [0.25, 0.25])
    np.testing.assert_allclose(out["behave_imp_weight"], np.exp(g - b))


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="one shape"):
        metric_values("rollout", a=np.zeros(2), b=np.zeros(2), t=np.zeros(3), g=np.zeros(2))


def test_no_truth_at_all_gives_empty_error_metrics():
    out = metric_values("loglinear", a=np.zeros(2), b=np.zeros(2), t=np.zeros(2), g=np.full(2, np.nan))
    assert len(out["abs_error"]) == 0 and len(out["approx_logp"]) == 2
