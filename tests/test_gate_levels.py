"""The approximation judged at the staleness the trainer runs: a check at each staleness 1..S, its intervals
family-wise 95% (Bonferroni), S from `--max-staleness`, the trainer's config recorded by replay, or the
log; the decision on each run (ship, ship up to k, do not ship, undecided); an excess pooled over the
stalenesses leaves staleness 0 out. Expectations are numpy over the very values the store was built from:
per-step sums, the bootstrap over steps by its definition (the documented seed and draws)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from test_gate import build_store, gate_file

from evaluator.cli import cli
from evaluator.formulas.bootstrap import REPLICATES, SEED
from evaluator.gate import run_gate
from evaluator.store import StoreWriter, connect_store
from evaluator.verdict import judge_db
from tests.reference import BOOTSTRAP_SEED
from tests.reference import REPLICATES as REFERENCE_REPLICATES

STEPS, SHIPPED = 20, "loglinear_shipped"
# per staleness: tokens and the gradient mass error of loglinear_shipped (staleness 0: the floor's own)
LEVELS = {0: (4000, 0.005), 1: (4000, 0.008), 2: (4000, 0.016), 3: (4000, 0.05), 4: (500, 0.05)}


def level_samples(run: str = "r", levels: dict = LEVELS, seed: int = 0) -> dict:
    """True gradient weights of 2 per token, absolute errors of 4 on random tokens (so that the per-step
    sums vary); at staleness 0 the method's errors are the floor's (`rollout`), as every estimate there is
    behave_logp."""
    rng, samples = np.random.default_rng(seed), {}
    for s, (n, gme) in levels.items():
        mass, error = np.full(n, 2.0), np.zeros(n)
        error[rng.choice(n, round(gme * 2 * n / 4), replace=False)] = 4.0
        samples[run, s, "ground_truth", "grad_weight"] = mass
        for method in (SHIPPED, "rollout") if s == 0 else (SHIPPED,):
            samples[run, s, method, "grad_weight_abs_error"] = error
            samples[run, s, method, "true_grad_weight"] = mass
    return samples


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return build_store(tmp_path_factory.mktemp("levels") / "m", level_samples(), steps=STEPS)


def per_step(samples: dict, s: int, method: str, metric: str) -> np.ndarray:
    """`[steps]` the sums of one series per step, as `build_store` spreads the values (value i in step i %
    STEPS)."""
    values = samples["r", s, method, metric]
    return np.array([values[k::STEPS].sum() for k in range(STEPS)])


def expected_levels(levels: list[int], family: int) -> dict[int, tuple[float, float, float]]:
    """(excess, lower, upper) of the gradient mass error at each staleness: the figure minus the floor's,
    and the percentile bootstrap over steps at 1 - 0.05 / family on REPLICATES * family draws, the floor
    resampled on the same draws."""
    samples = level_samples()
    rng = np.random.default_rng([SEED, STEPS])
    draws = rng.multinomial(STEPS, np.full(STEPS, 1 / STEPS), size=REPLICATES * family)

    def replicates(s: int, method: str) -> np.ndarray:
        num = per_step(samples, s, method, "grad_weight_abs_error")
        den = per_step(samples, s, method, "true_grad_weight")
        return (draws @ num) / (draws @ den)

    floor = per_step(samples, 0, "rollout", "grad_weight_abs_error").sum() / (2 * LEVELS[0][0])
    tail = 0.05 / family / 2 * 100
    out = {}
    for s in levels:
        point = per_step(samples, s, SHIPPED, "grad_weight_abs_error").sum() / (2 * LEVELS[s][0]) - floor
        excess = replicates(s, SHIPPED) - replicates(0, "rollout")
        lower, upper = np.percentile(excess, [tail, 100 - tail])
        out[s] = (point, lower, upper)
    return out


CHECK = """[defaults]
min_tokens = 1000
[[check]]
method = "loglinear_shipped"
figure = "excess_gradient_mass_error"
each_staleness = true
max = {max}
"""


def outcome(lower: float, upper: float, bound: float) -> str:
    return "threshold" if lower > bound else "ok" if upper <= bound else "inconclusive"


def test_the_reference_bootstrap_is_proxaudit_s():
    assert (BOOTSTRAP_SEED, REFERENCE_REPLICATES) == (SEED, REPLICATES)


def test_each_staleness_is_judged_on_its_family_wise_interval(store, tmp_path):
    """S from the log: staleness 4 has 500 tokens, so S = 3; each of 1..3 is the figure minus the floor
    with its Bonferroni interval (1 - 0.05 / 3), judged against the bound."""
    (verdict,) = run_gate(store, gate_file(tmp_path, CHECK.format(max=0.01))).verdicts
    expected = expected_levels([1, 2, 3], family=3)
    assert verdict.staleness == (1, 3) and [lv.staleness for lv in verdict.levels] == [1, 2, 3]
    for level in verdict.levels:
        point, lower, upper = expected[level.staleness]
        o = level.observed
        assert (o.value, o.lower, o.upper) == pytest.approx((point, lower, upper), rel=1e-9, abs=1e-15)
        assert (o.n, o.steps, o.family) == (LEVELS[level.staleness][0], STEPS, 3)
        assert level.outcome == outcome(lower, upper, 0.01), level
    # 95% alone would be narrower: the family's intervals contain the single ones
    single = expected_levels([1, 2, 3], family=1)
    assert all(expected[s][1] <= single[s][1] and single[s][2] <= expected[s][2] for s in (1, 2, 3))
    failing = [lv for lv in verdict.levels if lv.outcome == "threshold"]
    assert failing and (verdict.verdict, verdict.outcome) == ("fail", "threshold")
    assert verdict.reason.startswith(f"at staleness {failing[0].staleness}: excess_gradient_mass_error ")
    assert "(family-wise 95%: " in verdict.reason and verdict.observed is failing[0].observed


BOUNDS = {0.001: "do_not_ship", 0.01: "ship_up_to", 0.05: "undecided", 0.2: "ship"}
"""A bound for each action on these levels (excess 0.3%, 1.1%, 4.5% at staleness 1, 2, 3)."""


@pytest.mark.parametrize("bound", BOUNDS)
def test_the_decision_follows_each_staleness(store, tmp_path, bound):
    """The action by its rule from the levels' outcomes: k = the last staleness before the first one that
    does not pass; a failure ships up to k (do not ship at k = 0); nothing failing but something undecided
    cannot tell yet; all passing ships."""
    expected = expected_levels([1, 2, 3], family=3)
    outcomes = {s: outcome(lo, hi, bound) for s, (_, lo, hi) in expected.items()}
    k = next((s - 1 for s in (1, 2, 3) if outcomes[s] != "ok"), 3)
    if "threshold" in outcomes.values():
        action = "ship_up_to" if k >= 1 else "do_not_ship"
    else:
        action = "undecided" if "inconclusive" in outcomes.values() else "ship"
    (decision,) = judge_db(store, gate_file(tmp_path, CHECK.format(max=bound))).decisions
    assert (decision.action, decision.max_staleness, decision.limit.value) == (action, k, 3)
    assert decision.method == SHIPPED and str(decision.option) == "AReaL actor.prox_logp_method: loglinear"
    first = next((s for s in (1, 2, 3) if outcomes[s] == "threshold"), None)
    if first is None:
        first = next((s for s in (1, 2, 3) if outcomes[s] == "inconclusive"), None)
    if action != "ship":
        assert decision.reason.staleness == first and decision.reason.bound == bound
    assert action == BOUNDS[bound]  # the bounds make every action


def test_the_staleness_judged_comes_from_the_flag_the_config_or_the_log(store, tmp_path):
    gate = gate_file(tmp_path, CHECK.format(max=0.2))
    (verdict,) = run_gate(store, gate, max_staleness=2).verdicts
    assert verdict.staleness == (1, 2) and verdict.verdict == "pass"
    (verdict,) = run_gate(store, gate, max_staleness=6).verdicts  # the trainer allows more than the log
    assert (verdict.verdict, verdict.outcome) == ("fail", "insufficient_data")
    assert "at staleness 4: 500, 5: 0, 6: 0" in verdict.reason
    (verdict,) = run_gate(store, gate, max_staleness=0).verdicts
    assert (verdict.verdict, verdict.staleness) == ("pass", (1, 0)) and "staleness 0 only" in verdict.reason
    recorded = build_store(tmp_path / "recorded", level_samples(), steps=STEPS)  # the same store
    entry = {"value": 1, "source": "rollout.max_head_offpolicyness = 1 in areal.yaml (AReaL)", "key": "x"}
    with StoreWriter(recorded) as writer:
        writer.record_max_staleness(entry["value"], entry["source"], entry["key"])
    judgement = judge_db(recorded, gate)
    assert judgement.result.verdicts[0].staleness == (1, 1)
    assert judgement.decisions[0].limit.source == entry["source"] and judgement.decisions[0].limit.key == "x"
    assert judge_db(recorded, gate, max_staleness=3).result.verdicts[0].staleness == (1, 3)  # the flag wins


def test_an_excess_pooled_over_the_stalenesses_leaves_staleness_0_out(store):
    """decision_summary's excess and its stored 95% interval pool staleness >= 1 only (staleness 0's excess
    is 0 by construction and would dilute it)."""
    samples = level_samples()
    stale = [s for s in LEVELS if s > 0]
    num = sum(per_step(samples, s, SHIPPED, "grad_weight_abs_error") for s in stale)
    den = sum(per_step(samples, s, SHIPPED, "true_grad_weight") for s in stale)
    floor_num = per_step(samples, 0, "rollout", "grad_weight_abs_error")
    floor_den = per_step(samples, 0, "rollout", "true_grad_weight")
    draws = np.random.default_rng([SEED, STEPS]).multinomial(
        STEPS, np.full(STEPS, 1 / STEPS), size=REPLICATES
    )
    excess = (draws @ num) / (draws @ den) - (draws @ floor_num) / (draws @ floor_den)
    with connect_store(store) as con:
        row = con.execute(
            "SELECT excess_gradient_mass_error, excess_gradient_mass_error_lower, "
            "excess_gradient_mass_error_upper FROM decision_summary WHERE method = ?", [SHIPPED]
        ).fetchone()  # fmt: skip
    point = num.sum() / den.sum() - floor_num.sum() / floor_den.sum()
    assert row == pytest.approx((point, *np.percentile(excess, [2.5, 97.5])), rel=1e-9)
    everything = (num.sum() + floor_num.sum()) / (
        den.sum() + floor_den.sum()
    ) - floor_num.sum() / floor_den.sum()
    assert row[0] > everything  # what pooling staleness 0 in would have said


def test_replay_records_the_trainer_s_maximum_staleness_for_the_gate(tmp_path):
    """`replay --loss-from` an AReaL config with `rollout.max_head_offpolicyness`: the gate then judges up to
    it, and says where it came from; `replay --max-staleness` wins over a config."""
    from evaluator.logio import write_log_atomic
    from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps

    log = write_log_atomic(
        synthetic_steps(SyntheticSpec(run_id="c", tokens_per_step=2048), 8, 4), tmp_path / "c.parquet"
    )
    config = tmp_path / "areal.yaml"
    config.write_text("actor:\n  eps_clip: 0.2\nrollout:\n  max_head_offpolicyness: 3\n")
    db = tmp_path / "m"
    result = CliRunner().invoke(cli, ["replay", str(log), "--db", str(db), "--loss-from", str(config)])
    assert result.exit_code == 0, result.output
    assert f"max staleness: rollout.max_head_offpolicyness = 3 in {config} (AReaL)" in result.output
    (decision,) = judge_db(db).decisions
    assert decision.limit.value == 3 and decision.limit.key == "max_head_offpolicyness"
    judged = [v for v in decision.checks if v.check.each_staleness]
    assert {v.staleness for v in judged if v.verdict != "skip"} == {(1, 3)}
    # AReaL's default loss multiplies in no behaviour weight: no bound to flip, its check does not apply
    (bound,) = [v for v in judged if v.check.figure == "excess_bound_flip_rate"]
    assert (bound.verdict, bound.outcome) == (
        "skip",
        "not_applicable",
    ) and "no bound_flip decision" in bound.reason
    CliRunner().invoke(
        cli, ["replay", str(log), "--db", str(db), "--max-staleness", "8", "--loss-from", str(config)]
    )
    assert judge_db(db).decisions[0].limit.value == 8


KEYS = {  # a config: (value, where it was read, the key to set)
    "areal": ({"rollout": {"max_head_offpolicyness": 2}, "actor": {}},
              (2, "rollout.max_head_offpolicyness = 2 in c.yaml (AReaL)", "max_head_offpolicyness")),
    "prime-rl": ({"orchestrator": {"max_off_policy_steps": 8}},
                 (8, "orchestrator.max_off_policy_steps = 8 in c.yaml (prime-rl)", "max_off_policy_steps")),
    "prime-rl orchestrator": ({"max_off_policy_steps": 0},
                              (0, "max_off_policy_steps = 0 in c.yaml (prime-rl)", "max_off_policy_steps")),
    "trl": ({"max_staleness": 4}, (4, "max_staleness = 4 in c.yaml (TRL)", "max_staleness")),
    "absent": ({"rollout": {"consumer_batch_size": 8}, "actor": {}}, None),  # AReaL's default not assumed
}  # fmt: skip


@pytest.mark.parametrize("config, expected", KEYS.values(), ids=KEYS)
def test_the_trainer_s_maximum_staleness_is_read_by_its_real_key(config, expected):
    from evaluator.lossconfig.staleness import max_staleness

    assert max_staleness(config, "c.yaml") == expected


@pytest.mark.parametrize("value", [-1, 2.5, "2", True])
def test_a_maximum_staleness_that_is_not_a_count_is_an_error_naming_the_file_and_key(value):
    from evaluator.errors import UsageError
    from evaluator.lossconfig.staleness import max_staleness

    with pytest.raises(
        UsageError, match=r"^c\.yaml: rollout\.max_head_offpolicyness: .* must be an integer >= 0"
    ):
        max_staleness({"rollout": {"max_head_offpolicyness": value}}, "c.yaml")
