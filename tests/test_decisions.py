"""The decision metrics of DOMAIN.md 3b: where an estimate of prox reaches the gradient. Hand-worked
tokens for each function and metric: a clip flipped for one sign of the advantage only, a bound crossed,
a large error that flips nothing, the clamp action, no advantage."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evaluator.formulas.gradients import LOG_WEIGHT_MAX, clip_active, decide, weight
from evaluator.formulas.loss import Loss, Rule
from evaluator.formulas.metrics import metric_values

P = Loss()  # eps 0.2 both ways, behaviour weight masked above U = 5
CLAMP = Loss(rules=(Rule(upper=5.0, action="clamp"),))


def decided(x, *, b, t, advantage=None, loss=P):
    arr = lambda v: np.atleast_1d(np.asarray(v, dtype=np.float64))  # noqa: E731
    x, b, t = arr(x), arr(b), arr(t)
    adv = None if advantage is None else arr(advantage)
    size = 1.0 if adv is None else np.abs(adv)
    return decide(
        x, t=t, b=b, advantage=adv, abs_advantage=size, off_policy_weight=weight(t - b), seq=None, loss=loss
    )


def values(a, *, b, t, g, advantage=None, loss=P) -> dict[str, np.ndarray]:
    arr = lambda x: np.atleast_1d(np.asarray(x, dtype=np.float64))  # noqa: E731
    return metric_values(
        "loglinear",
        a=arr(a),
        b=arr(b),
        t=arr(t),
        g=arr(g),
        advantage=None if advantage is None else arr(advantage),
        loss=loss,
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
        p = Loss(eps_low=0.2, eps_high=0.28)  # DAPO's clip-higher
        np.testing.assert_array_equal(clip_active(np.array([1.25, 1.3]), np.ones(2), p), [False, True])


class TestBoundActive:
    def test_strictly_above_u(self):
        # behaviour weights exp(x - b) of 4.9, 5.0 and 5.1: masked strictly above U = 5 (AReaL keeps <= upper)
        x = np.log([4.9, 5.0, 5.1])
        got = decided(x, b=np.zeros(3), t=x)
        np.testing.assert_array_equal(got.bound, [False, False, True])


class TestGradWeight:
    def test_mask(self):
        # |A| exp(t - b) = 1.5 * 2 where neither decision is active; 0 where the ratio clips or the weight
        # passes U. Token 1: ratio exp(t - x) = 2 clips (A > 0); token 2: exp(x - b) = 6 is masked.
        x = np.array([np.log(2.0), 0.0, np.log(6.0)]) - 3
        b = np.array([0.0, np.log(0.5), 0.0]) - 3
        t = np.array([np.log(2.0), np.log(2.0), np.log(6.0)]) + np.array([0.0, 0.0, np.log(1 / 3)]) - 3
        got = decided(x, b=b, t=t, advantage=np.full(3, 1.5))
        np.testing.assert_allclose(got.grad_weight, [3.0, 0.0, 0.0], rtol=1e-14)

    def test_clamp_scales_above_u_instead_of_masking(self):
        # exp(x - b) = 7 > U: |A| * U * exp(t - x) = 1 * 5 * 0.5 (no advantage: the two-sided clip of
        # 0.5 would turn it off, so give A = 1 and a ratio 0.9 instead: 5 * 0.9)
        got = decided(np.log(7.0) - 2, b=-2.0, t=np.log(7.0 * 0.9) - 2, advantage=1.0, loss=CLAMP)
        assert got.grad_weight[0] == pytest.approx(4.5, rel=1e-14)


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
        got = values(-1.3, b=-3.0, t=-1.4, g=-1.5, loss=CLAMP)
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


class TestLoss:
    def test_rejects_impossible_losses(self):
        bad_losses = (
            dict(eps_low=1.5),
            dict(eps_high=-0.1),
            dict(dual_clip=0.9),
            dict(policy="sapo", dual_clip=2.0),
            dict(policy="cispo", ratio_level="sequence"),
            dict(behave_weight="none", rules=(Rule(upper=2.0, action="clamp"),)),
            dict(policy="dpo"),
        )
        for bad in bad_losses:
            with pytest.raises(ValueError):
                Loss(**bad)

    def test_rejects_impossible_rules(self):
        for bad in (dict(), dict(lower=2.0, upper=1.0), dict(statistic="kl_k2", upper=1.0, action="clamp"),
                    dict(level="row", upper=1.0), dict(upper=float("nan"))):  # fmt: skip
            with pytest.raises(ValueError):
                Rule(**bad)
