"""The decision metrics of DOMAIN.md 3b: where an estimate of prox reaches the gradient. Hand-worked
tokens for each function and metric: a clip flipped for one sign of the advantage only, a bound crossed,
a large error that flips nothing, the clamp action, no advantage."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evaluator.formulas.decisions import (
    LOG_WEIGHT_MAX,
    DecisionParams,
    bound_active,
    clip_active,
    grad_weight,
    weight,
)
from evaluator.formulas.metrics import metric_values

P = DecisionParams()  # eps 0.2 both ways, U = 5, mask
CLAMP = DecisionParams(bound_action="clamp")


def values(a, *, b, t, g, advantage=None, params=P) -> dict[str, np.ndarray]:
    arr = lambda x: np.atleast_1d(np.asarray(x, dtype=np.float64))  # noqa: E731
    return metric_values(
        "loglinear",
        a=arr(a),
        b=arr(b),
        t=arr(t),
        g=arr(g),
        advantage=None if advantage is None else arr(advantage),
        params=params,
    )


class TestWeight:
    def test_is_exp_below_the_cap(self):
        assert weight(np.array([0.5]))[0] == math.exp(0.5)

    def test_caps_the_log_ratio_so_squares_stay_finite(self):
        big = weight(np.array([800.0, LOG_WEIGHT_MAX]))
        assert big[0] == big[1] == math.exp(LOG_WEIGHT_MAX) and np.isfinite(big**2 * 2).all()


class TestClipActive:
    def test_one_sided_by_the_sign_of_the_advantage(self):
        # ratio 1.3 passes 1 + 0.2: clipped for A > 0 only; ratio 0.7 passes 1 - 0.2: for A < 0 only
        ratio = np.array([1.3, 1.3, 0.7, 0.7, 1.3])
        advantage = np.array([1.0, -1.0, 1.0, -1.0, 0.0])
        np.testing.assert_array_equal(clip_active(ratio, advantage, P), [True, False, False, True, False])

    def test_two_sided_without_advantage_or_where_it_is_missing(self):
        ratio = np.array([1.3, 0.7, 1.1])
        np.testing.assert_array_equal(clip_active(ratio, None, P), [True, True, False])
        np.testing.assert_array_equal(clip_active(ratio, np.full(3, np.nan), P), [True, True, False])

    def test_asymmetric_epsilons(self):
        p = DecisionParams(eps_low=0.2, eps_high=0.28)  # DAPO's clip-higher
        np.testing.assert_array_equal(clip_active(np.array([1.25, 1.3]), np.ones(2), p), [False, True])


class TestBoundActive:
    def test_strictly_above_u(self):
        np.testing.assert_array_equal(bound_active(np.array([4.9, 5.0, 5.1]), P), [False, False, True])


class TestGradWeight:
    def test_mask(self):
        # |A| exp(t - b) where neither decision is active; 0 where either is
        off, ratio = np.full(3, 2.0), np.ones(3)
        clipped, bounded = np.array([False, True, False]), np.array([False, False, True])
        np.testing.assert_array_equal(grad_weight(off, ratio, clipped, bounded, 1.5, P), [3.0, 0.0, 0.0])

    def test_clamp_scales_above_u_instead_of_masking(self):
        # above U: |A| * U * exp(t - x) = 1 * 5 * 0.5
        w = grad_weight(np.array([7.0]), np.array([0.5]), np.array([False]), np.array([True]), 1.0, CLAMP)
        assert w[0] == 2.5


class TestDecisionMetrics:
    def test_clip_flipped_only_for_positive_advantage(self):
        # t = -1.0, g = -1.1: true ratio exp(0.1) = 1.105, inside [0.8, 1.2].
        # a = -1.25: estimated ratio exp(0.25) = 1.284 > 1.2: the clip turns on for A > 0, not for A < 0
        # (the ratio is above the range, which only clips a positive advantage).
        # b = -1.2: behaviour weights exp(0.1) and exp(-0.05), far below U.
        pos = values(-1.25, b=-1.2, t=-1.0, g=-1.1, advantage=2.0)
        neg = values(-1.25, b=-1.2, t=-1.0, g=-1.1, advantage=-2.0)
        assert (pos["clip_active"][0], pos["clip_flip"][0]) == (1.0, 1.0)
        assert (neg["clip_active"][0], neg["clip_flip"][0]) == (0.0, 0.0)
        # true W = |A| exp(t - b) = 2 exp(0.2); the estimate turns it off entirely for A > 0
        assert pos["grad_weight"][0] == 0.0
        assert pos["grad_weight_abs_error"][0] == pytest.approx(2 * math.exp(0.2), rel=1e-15)
        assert neg["grad_weight_abs_error"][0] == 0.0

    def test_bound_crossed(self):
        # b = -3: true weight exp(g - b) = exp(1.5) = 4.48 < 5, estimated exp(1.7) = 5.47 > 5: masked.
        # t = -1.4: ratios exp(t - a) = exp(-0.1) = 0.905 and exp(t - g) = exp(0.1) = 1.105, both inside
        # [0.8, 1.2], so no clip on either side (no advantage: two-sided)
        got = values(-1.3, b=-3.0, t=-1.4, g=-1.5)
        assert (got["bound_active"][0], got["bound_flip"][0], got["clip_flip"][0]) == (1.0, 1.0, 0.0)
        assert got["grad_weight"][0] == 0.0  # masked
        assert got["grad_weight_abs_error"][0] == pytest.approx(math.exp(-1.4 + 3.0), rel=1e-15)  # |A| = 1

    def test_large_error_that_flips_nothing_moves_no_gradient(self):
        # a is 0.3 nats off g, but both ratios stay inside the clip range for A < 0 (only the lower
        # edge counts there: exp(t - a) = exp(0.15) and exp(t - g) = exp(-0.15) = 0.86 > 0.8), and both
        # behaviour weights stay under U: the gradient coefficient is exactly the true one
        got = values(-2.15, b=-2.0, t=-2.0, g=-1.85, advantage=-1.0)
        assert got["abs_error"][0] == pytest.approx(0.3)
        assert (got["clip_flip"][0], got["bound_flip"][0]) == (0.0, 0.0)
        assert got["grad_weight_abs_error"][0] == 0.0  # exactly: |A| exp(t - b) does not involve prox
        assert got["grad_weight"][0] == 1.0

    def test_clamp_action(self):
        # the bound case again, clamped instead of masked: W(a) = |A| U exp(t - a) = 5 exp(-0.1),
        # W(g) = |A| exp(t - b) = exp(1.6) (below U the clamp changes nothing)
        got = values(-1.3, b=-3.0, t=-1.4, g=-1.5, params=CLAMP)
        assert got["grad_weight"][0] == pytest.approx(5 * math.exp(-0.1), rel=1e-15)
        assert got["grad_weight_abs_error"][0] == pytest.approx(math.exp(1.6) - 5 * math.exp(-0.1), rel=1e-14)

    def test_without_advantage_both_edges_clip_and_the_size_is_one(self):
        # ratio exp(t - a) = exp(-0.3) = 0.74 < 0.8: clipped without an advantage (two-sided)
        got = values(-0.7, b=-1.0, t=-1.0, g=-1.0)
        assert got["clip_active"][0] == 1.0 and got["clip_flip"][0] == 1.0
        assert got["grad_weight_abs_error"][0] == pytest.approx(1.0)  # |A| = 1, exp(t - b) = 1

    def test_behave_approx_kl_is_the_log_behaviour_weight(self):
        got = values(-1.3, b=-1.0, t=-1.0, g=-1.2)
        assert got["behave_approx_kl"][0] == pytest.approx(-0.3)
        assert got["behave_imp_weight"][0] == pytest.approx(math.exp(-0.3))

    def test_ground_truth_has_no_flip_or_error_series(self):
        truth = metric_values(
            "ground_truth", a=np.array([-1.0]), b=np.array([-1.0]), t=np.array([-1.0]), g=np.array([-1.0])
        )
        assert {"clip_active", "bound_active", "grad_weight", "drift", "prob_drift"} <= set(truth)
        assert not {"clip_flip", "bound_flip", "grad_weight_abs_error"} & set(truth)

    def test_extreme_log_probs_keep_every_metric_finite(self):
        # valid (finite, <= 0) but extreme: exp(g - b) = exp(900) would overflow
        got = values(-100.0, b=-1000.0, t=-50.0, g=-100.0, advantage=1.0)
        assert all(np.isfinite(v).all() for v in got.values())


class TestParams:
    def test_rejects_impossible_thresholds(self):
        for bad in (dict(eps_low=1.0), dict(eps_high=-0.1), dict(bound=0.0), dict(bound_action="drop")):
            with pytest.raises(ValueError):
                DecisionParams(**bad)
