"""`--loss-from` the newer trainer keys (issue 36 item 1): AReaL's m2_threshold, verl's dppo_tv, dppo_kl,
geo_mean and dro, NeMo-RL's seq_logprob_error_threshold, a TRL GRPOConfig YAML and a prime-rl TOML; each
gives the loss the trainer runs, with its keys named, and bad values are usage errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluator.errors import UsageError
from evaluator.formulas.loss import Loss, Rule
from evaluator.lossconfig import resolve


def read(tmp_path: Path, text: str, name: str = "config.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return resolve(loss_from=str(path))


def same(a: Loss, b: Loss) -> bool:
    return a == b  # `name` is not compared


CASES = {
    "AReaL M2PO": (
        "actor:\n  eps_clip: 0.0\n  m2_threshold: 0.04\n"
        "  rejection_sampling:\n    metric: ratio\n    upper: 5.0\n",
        Loss(eps_low=0.0, eps_high=0.0, m2_threshold=0.04),
    ),
    "verl dppo_tv": (
        "actor_rollout_ref:\n  actor:\n    clip_ratio_low: 0.15\n    clip_ratio_high: 0.2\n"
        "    clip_ratio_c: 10000.0\n    policy_loss:\n      loss_mode: dppo_tv\n",
        Loss(policy="dppo_tv", eps_low=0.15, eps_high=0.2, dual_clip=10000.0, behave_weight="none", rules=()),
    ),
    "verl dppo_kl, its clip_ratio_c default": (
        "actor_rollout_ref:\n  actor:\n    clip_ratio: 0.05\n    policy_loss:\n      loss_mode: dppo_kl\n",
        Loss(policy="dppo_kl", eps_low=0.05, eps_high=0.05, dual_clip=3.0, behave_weight="none", rules=()),
    ),
    "verl geo_mean with token IS": (
        "algorithm:\n  rollout_correction:\n    rollout_is: token\n"
        "actor_rollout_ref:\n  actor:\n    clip_ratio: 0.4\n    policy_loss:\n      loss_mode: geo_mean\n",
        Loss(
            policy="gmpo",
            ratio_level="sequence",
            eps_low=0.4,
            eps_high=0.4,
            rules=(Rule(upper=2.0, action="clamp"),),
        ),  # fmt: skip
    ),
    "verl dro": (
        "actor_rollout_ref:\n  actor:\n    policy_loss:\n      loss_mode: dro\n      dro_beta: 0.1\n",
        Loss(policy="pg", kl_penalty=0.05, behave_weight="none", rules=()),
    ),
    "NeMo-RL seq_logprob_error_threshold": (
        "loss_fn:\n  ratio_clip_min: 0.2\n  ratio_clip_max: 0.28\ngrpo:\n  seq_logprob_error_threshold: 2\n",
        Loss(
            eps_high=0.28,
            behave_weight="none",
            rules=(Rule("sequence", "mult_prob_error", "mean", upper=2.0),),
        ),
    ),
    "TRL defaults": (
        "loss_type: dapo\nnum_generations: 8\n",
        Loss(behave_weight="sequence_product", rules=(Rule("sequence", "ratio", "sum", upper=3.0),)),
    ),
    "TRL cispo: the ratio clamped at epsilon_high": (
        "loss_type: cispo\nepsilon_high: 5.0\nvllm_importance_sampling_correction: false\n",
        Loss(policy="cispo", eps_low=1.0, eps_high=4.0, behave_weight="none", rules=()),
    ),
    "TRL token truncation, delta, GSPO": (
        "epsilon: 0.2\nepsilon_high: 0.28\ndelta: 1.5\nimportance_sampling_level: sequence\n"
        "vllm_importance_sampling_mode: token_truncate\nvllm_importance_sampling_clip_max: 2.0\n",
        Loss(
            eps_high=0.28, dual_clip=1.5, ratio_level="sequence", rules=(Rule(upper=2.0, action="clamp"),)
        ),  # fmt: skip
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_trainer_configs(tmp_path, name):
    text, expected = CASES[name]
    choice = read(tmp_path, text)
    assert same(choice.loss, expected), choice.loss
    assert choice.used


def test_prime_rl_toml(tmp_path):
    choice = read(tmp_path, '[trainer.loss]\ntype = "ipo"\nipo_threshold = 0.05\nkl_tau = 0.002\n', "rl.toml")
    assert same(choice.loss, Loss(policy="ipo", eps_low=0.05, eps_high=0.05, kl_penalty=0.002,
                                  behave_weight="none", rules=()))  # fmt: skip
    assert any("rollout" in n for n in choice.notes)
    default = read(tmp_path, "[loss]\nadv_tau = 2.0\n", "trainer.toml").loss
    assert same(default, Loss(policy="dppo_tv", kl_penalty=5e-4, behave_weight="none", rules=()))


def test_prime_rl_rl_config_as_shipped(tmp_path):
    """prime-rl's shipped rl configs set no [trainer.loss]: prime-rl runs its default loss, said in a note;
    the orchestrator's max_off_policy_steps is the maximum staleness the gate judges up to."""
    text = "[trainer.optim]\nlr = 1e-6\n\n[orchestrator]\nbatch_size = 512\nmax_off_policy_steps = 8\n"
    choice = read(tmp_path, text, "rl.toml")
    assert same(choice.loss, Loss(policy="dppo_tv", kl_penalty=1e-3, behave_weight="none", rules=()))
    assert any("no [trainer.loss]: prime-rl's default loss (DefaultLossConfig)" in n for n in choice.notes)
    where = f"orchestrator.max_off_policy_steps = 8 in {tmp_path / 'rl.toml'} (prime-rl)"
    assert choice.max_staleness == (8, where, "max_off_policy_steps")
    assert f"  max staleness: {where}: the gate judges staleness 1 to it" in choice.lines()
    with_loss = read(
        tmp_path, '[trainer.loss]\ntype = "ipo"\n[orchestrator]\nmax_off_policy_steps = 2\n', "rl.toml"
    )
    assert with_loss.loss.policy == "ipo" and with_loss.max_staleness[0] == 2
    assert not any("DefaultLossConfig" in n for n in with_loss.notes)


def test_trl_max_staleness_is_read_not_ignored(tmp_path):
    choice = read(tmp_path, "loss_type: dapo\nmax_staleness: 4\nbeta: 0.04\n", "trl.yaml")
    assert choice.max_staleness == (4, f"max_staleness = 4 in {tmp_path / 'trl.yaml'} (TRL)", "max_staleness")
    assert [i.split(" (")[0] for i in choice.ignored] == ["beta"]


def test_the_maximum_staleness_is_read_by_the_config_s_own_trainer(tmp_path):
    """A key of another trainer's (TRL's top-level max_staleness in an AReaL config) is not its maximum."""
    choice = read(tmp_path, "actor:\n  eps_clip: 0.2\nmax_staleness: 4\n", "areal.yaml")
    assert choice.max_staleness is None
    areal = read(tmp_path, "actor:\n  eps_clip: 0.2\nrollout:\n  max_head_offpolicyness: 2\n", "areal.yaml")
    assert areal.max_staleness[0] == 2


@pytest.mark.parametrize(
    "text, name, message",
    [
        ("actor_rollout_ref:\n  actor:\n    policy_loss:\n      loss_mode: dro\n", "c.yaml", "dro_beta"),
        ("[trainer]\nloss = 5\n", "c.toml", "trainer.loss: 5 must be a table of keys"),
        (
            "[trainer.loss]\n[orchestrator]\nmax_off_policy_steps = -1\n",
            "c.toml",
            "orchestrator.max_off_policy_steps: -1 must be an integer >= 0",
        ),
        ("actor:\n  m2_threshold: -1\n", "c.yaml", "m2_threshold"),
        ('[loss]\ntype = "custom"\n', "c.toml", "type"),
        ("[optimizer]\nlr = 1\n", "c.toml", "[loss]"),
        ("loss_type: vespo\n", "c.yaml", "loss_type"),
        ("[loss]\nkl_tau = -1\n", "c.toml", "loss.kl_tau: -1 must be >= 0"),
        ("[loss]\nadv_tau = 0\n", "c.toml", "loss.adv_tau: 0 must be > 0"),
        (
            "grpo:\n  seq_logprob_error_threshold: 2\nppo:\n  seq_logprob_error_threshold: 2\nloss_fn: {}\n",
            "c.yaml",
            "ppo.seq_logprob_error_threshold: set in grpo and in ppo",
        ),
    ],
)
def test_bad_configs_name_the_key(tmp_path, text, name, message):
    with pytest.raises(UsageError, match=message.replace("[", r"\[")):
        read(tmp_path, text, name)
