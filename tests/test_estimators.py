"""The estimators of DOMAIN.md section 2: hand-worked values, AReaL's worked values, edges, properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from evaluator.estimators import (
    alpha,
    areal_versions,
    estimates,
    exact_versions,
    ground_truth,
    linear,
    loglinear,
    proximal_t,
    rollout,
)

logps = st.floats(min_value=-1000.0, max_value=0.0, allow_nan=False)
alphas = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


class TestAlpha:
    def test_hand_worked(self):
        # v_behave 3, v_prox 4, v_theta 5: (4 - 3) / (5 - 3) = 0.5
        assert alpha(4, 3, 5) == 0.5
        # areal at staleness 3 (step 10, v_behave 7): (9 - 7) / (10 - 7) = 2/3
        v_prox, v_theta = areal_versions(10)
        assert alpha(v_prox, 7, v_theta) == pytest.approx(2 / 3)

    def test_clamped_to_unit_interval(self):
        # v_prox before v_behave gives a negative ratio -> 0; beyond v_theta -> 1
        np.testing.assert_array_equal(alpha([2, 9], [3, 3], [5, 5]), [0.0, 1.0])

    def test_theta_not_ahead_of_behave_gives_zero(self):
        # v_theta == v_behave (fresh token under areal: step 10, v_behave 10) and v_theta < v_behave
        np.testing.assert_array_equal(alpha([9, 9], [10, 11], [10, 10]), [0.0, 0.0])

    def test_exact_convention(self):
        # step 10, minibatch 2 of 4, v_behave 8: v_theta = 10.5, alpha = (10 - 8) / 2.5 = 0.8
        v_prox, v_theta = exact_versions(10, 2, 4)
        assert alpha(v_prox, 8, v_theta) == pytest.approx(0.8)
        # minibatch 0: theta is prox, alpha = 1 for a stale token, 0 for a fresh one
        v_prox, v_theta = exact_versions(np.array([10, 10]), 0, 4)
        np.testing.assert_array_equal(alpha(v_prox, np.array([8, 10]), v_theta), [1.0, 0.0])

    def test_shape_mismatch_raises_naming_shapes(self):
        with pytest.raises(ValueError, match=r"\(2,\).*\(3,\)"):
            alpha(np.zeros(2), np.zeros(3), np.ones(2))


class TestLoglinear:
    def test_areal_worked_value(self):
        # AReaL: alpha 0.5 between -1.0 and -1.5 -> -1.0 + 0.5 * (-1.5 + 1.0) = -1.25
        assert loglinear(-1.0, -1.5, 0.5) == -1.25

    def test_exact_at_alpha_0_and_1(self):
        b, t = np.array([-0.3, -7.1]), np.array([-0.1, -2.9])
        np.testing.assert_array_equal(loglinear(b, t, np.zeros(2)), b)
        np.testing.assert_array_equal(loglinear(b, t, np.ones(2)), t)

    @given(logps, logps, alphas)
    def test_between_behave_and_theta(self, b, t, a):
        value = loglinear(b, t, a)
        assert min(b, t) - 1e-9 <= value <= max(b, t) + 1e-9


class TestLinear:
    def test_areal_worked_value(self):
        # probabilities 0.5 and 0.25 at alpha 0.5: 0.5 * 0.5 + 0.5 * 0.25 = 0.375
        assert linear(math.log(0.5), math.log(0.25), 0.5) == pytest.approx(math.log(0.375), rel=1e-15)

    def test_exact_at_alpha_0_and_1(self):
        b, t = np.array([-0.3, -700.0]), np.array([-0.1, -2.9])
        np.testing.assert_array_equal(linear(b, t, np.zeros(2)), b)
        np.testing.assert_array_equal(linear(b, t, np.ones(2)), t)

    def test_stable_down_to_minus_1000(self):
        # exp(-1000) underflows to 0, so the naive form gives -inf; the stable one gives
        # log(0.5 e^-1000 + 0.5 e^-999) = -999 + log(0.5 (e^-1 + 1))
        value = linear(-1000.0, -999.0, 0.5)
        assert value == pytest.approx(-999.0 + math.log(0.5 * (math.exp(-1.0) + 1.0)), rel=1e-14)
        assert np.isfinite(linear(np.full(3, -1000.0), np.full(3, -1000.0), np.array([0.0, 0.3, 1.0]))).all()

    def test_differs_from_areal_floor_only_far_below(self):
        # AReaL adds 1e-10 inside the log; at -1000 it floors at log(1e-10) = -23.03 and we do not
        areal = math.log(0.5 * math.exp(-1000.0) + 0.5 * math.exp(-1000.0) + 1e-10)
        assert areal == pytest.approx(-23.02585, abs=1e-5)
        assert linear(-1000.0, -1000.0, 0.5) == pytest.approx(-1000.0)

    @given(logps, logps, alphas)
    def test_at_least_loglinear(self, b, t, a):
        # Jensen: log of a mixture >= mixture of logs
        assert linear(b, t, a) >= loglinear(b, t, a) - 1e-9 * (1 + abs(b) + abs(t))

    @given(logps, logps)
    def test_exact_at_endpoints_property(self, b, t):
        assert linear(b, t, 0.0) == b and linear(b, t, 1.0) == t


class TestRollout:
    def test_is_behave(self):
        b = np.array([-0.5, -3.0], dtype=np.float32)
        out = rollout(b)
        assert out.dtype == np.float64
        np.testing.assert_array_equal(out, b.astype(np.float64))


class TestProximalT:
    def test_passes_the_column_through_with_nan_where_missing(self):
        np.testing.assert_array_equal(proximal_t([-0.2, np.nan]), [-0.2, np.nan])


class TestGroundTruth:
    def test_is_prox_logp(self):
        np.testing.assert_array_equal(ground_truth(np.array([-1.5], np.float32)), [-1.5])


class TestEstimates:
    def test_every_method_on_hand_worked_tokens(self):
        # token 0: step 4, v_behave 2 (staleness 2), minibatch 1 of 2
        #   areal alpha = (3 - 2) / (4 - 2) = 0.5; exact alpha = (4 - 2) / (4.5 - 2) = 0.8
        # token 1: fresh (staleness 0): both alphas 0 -> every estimate is behave
        out = estimates(
            behave_logp=np.array([-1.0, -0.7]),
            theta_logp=np.array([-1.5, -0.2]),
            prox_logp=np.array([-1.2, np.nan]),
            step=np.array([4, 4]),
            behave_version=np.array([2, 4]),
            minibatch=np.array([1, 1]),
            n_minibatches=np.array([2, 2]),
        )
        assert list(out) == [
            "ground_truth",
            "loglinear",
            "linear",
            "loglinear_exact",
            "linear_exact",
            "rollout",
        ]
        np.testing.assert_allclose(out["loglinear"], [-1.25, -0.7])
        np.testing.assert_allclose(out["loglinear_exact"], [-1.0 + 0.8 * -0.5, -0.7])
        np.testing.assert_allclose(
            out["linear"], [math.log(0.5 * math.exp(-1.0) + 0.5 * math.exp(-1.5)), -0.7], rtol=1e-15
        )
        np.testing.assert_allclose(
            out["linear_exact"], [math.log(0.2 * math.exp(-1.0) + 0.8 * math.exp(-1.5)), -0.7], rtol=1e-15
        )
        np.testing.assert_array_equal(out["rollout"], [-1.0, -0.7])
        np.testing.assert_array_equal(out["ground_truth"], [-1.2, np.nan])

    def test_proximal_t_only_when_given(self):
        kwargs = dict(
            behave_logp=[-1.0], theta_logp=[-1.0], prox_logp=[-1.0], step=[1], behave_version=[1],
            minibatch=[0], n_minibatches=[1],
        )  # fmt: skip
        assert "proximal_t" not in estimates(**kwargs)
        assert estimates(**kwargs, proximal_t_logp=[-0.9])["proximal_t"][0] == pytest.approx(-0.9)
