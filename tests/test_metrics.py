"""The metric table of DOMAIN.md section 3: hand-worked values, coverage, and agreement with the store (what
replay stores is `metric_values` of the log's loss tokens)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from evaluator.formulas.estimators import estimates
from evaluator.formulas.gradients import Sequences
from evaluator.formulas.loss import Loss, Rule
from evaluator.formulas.metrics import metric_values
from evaluator.logio import write_log_atomic
from evaluator.replay import replay
from evaluator.store import connect_store
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps
from schemas.store import METRIC_TABLE, VERL_DIAGNOSTICS, metrics_for
from tests.reference import loss_tokens

DOCS = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


def test_the_docs_table_is_the_metric_table():
    text = DOCS.read_text()
    table = text[text.index("<!-- metric-table -->") : text.index("<!-- /metric-table -->")]
    rows = [[c.strip().strip("`") for c in line.strip("|").split("|")] for line in table.splitlines()[3:]]
    when = {None: "always", "has_clip": "a clip", "has_dual_clip": "a dual clip", "has_rules": "a rule",
            "has_lower_bound": "a lower bound", "has_sequence_clip": "a sequence clip",
            "sequence_rules": "a sequence rule"}  # fmt: skip
    expected = [
        [m.name, m.formula, "yes" if m.needs_truth else "no", m.of, m.per, when[m.when]] for m in METRIC_TABLE
    ]
    assert rows == expected


def test_drift_belongs_to_ground_truth_only():
    assert "drift" in {m.name for m in metrics_for("ground_truth", Loss())}
    assert "drift" not in {m.name for m in metrics_for("loglinear", Loss())}
    # 14 for every method (10 of section 3, behave_approx_kl, clip_active, bound_active, grad_weight)
    # + 2 flips, the gradient weight's error and the true weight on the same tokens for the estimators,
    # + 3 drifts and slime's per-sequence drift for the ground truth; no dual clip, lower bound or sequence
    # decision in the default loss
    core = lambda method: [m for m in metrics_for(method, Loss()) if m not in VERL_DIAGNOSTICS]  # noqa: E731
    assert len(core("linear")) == 18 and len(core("ground_truth")) == 18
    sequence = Loss(
        ratio_level="sequence", dual_clip=2.0, rules=(Rule("sequence", "ratio", lower=0.5, upper=2),)
    )
    added = {m.name for m in metrics_for("linear", sequence)} - {
        m.name for m in metrics_for("linear", Loss())
    }
    assert added == {
        "dual_clip_active", "dual_clip_flip", "bound_lower_flip", "sequence_clip_active",
        "sequence_clip_flip", "sequence_bound_active", "sequence_bound_flip",
    }  # fmt: skip
    assert {
        m.name for m in metrics_for("linear", Loss(policy="sapo", behave_weight="none", rules=()))
    }.isdisjoint({"clip_active", "clip_flip", "bound_active", "bound_flip"})


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
        "true_grad_weight": 0.0,
        # verl's diagnostics of d = a - b = 0.5: exp(0.5) = 1.65 is inside [1/2, 2]
        "is_weight": math.exp(0.5),
        "is_weight_truncated": math.exp(0.5),
        "prob_diff": math.exp(-1.0) - math.exp(-1.5),
        "is_weight_high": 0.0,
        "is_weight_low": 0.0,
        "approx_prob": math.exp(-1.0),
        "behave_prob": math.exp(-1.5),
        "prob_product": math.exp(-2.5),
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


def test_agreement_with_the_store(tmp_path):
    """Replay summarises the log batch by batch, with shared terms, masks and its own version pairing;
    the store must hold what `metric_values` gives on the whole log's loss tokens at once: for every
    method and metric of run_summary, n exactly, min and max to the last bits, the mean to 1e-12. The log
    records prox_logp on every other step, has proximal_t on resumed segments and an advantage."""
    spec = SyntheticSpec(run_id="agree", tokens_per_step=1024, mean_length=24, prox_every=2, drift=0.3)
    log = write_log_atomic(synthetic_steps(spec, 5, 6), tmp_path / "agree.parquet")
    replay([log], tmp_path / "m", progress=False)
    with connect_store(tmp_path / "m") as con:
        rows = con.execute("SELECT method, metric, n, mean, min, max FROM run_summary").fetchall()
    stored = {(method, metric): stats for method, metric, *stats in rows}
    df = loss_tokens([log])
    col = {c: df[c].to_numpy(np.float64) for c in ("behave_logp", "theta_logp", "prox_logp", "advantage")}
    per_method = estimates(
        **{c: df[c].to_numpy() for c in ("behave_logp", "theta_logp", "prox_logp", "proximal_t_logp")},
        **{c: df[c].to_numpy() for c in ("step", "behave_version", "minibatch", "n_minibatches")},
        prev_version=df["prev_version"].to_numpy(),
    )
    code = df.groupby(["run_id", "seq_id", "minibatch"], sort=False).ngroup().to_numpy()
    sequences = Sequences(code, int(code.max()) + 1)
    b, t, g, advantage = (col[c] for c in ("behave_logp", "theta_logp", "prox_logp", "advantage"))
    expected = {}
    for method, a in per_method.items():
        got = metric_values(method, a=a, b=b, t=t, g=g, advantage=advantage, sequences=sequences)
        for metric, v in got.items():
            expected[method, metric] = (len(v), v.mean(), v.min(), v.max())
    assert set(stored) == set(expected)
    for key, (n, mean, low, high) in expected.items():
        got_n, got_mean, got_low, got_high = stored[key]
        assert got_n == n, key
        assert got_mean == pytest.approx(mean, rel=1e-12, abs=1e-300), key
        assert (got_low, got_high) == pytest.approx((low, high), rel=1e-15, abs=1e-300), key
