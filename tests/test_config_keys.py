"""`--loss-from` never guesses: every key of the sections it reads must be one the trainer knows at the
pinned commit (a typo at any depth is exit 2 naming the key and its nearest known key), AReaL's older keys
are read as AReaL's own migration maps them, and a key known but not modelled is listed as ignored with
its reason. The trainers' real configs (fixtures/trainer_configs) load as they ship."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evaluator.cli import cli
from evaluator.cli.common import EXIT_OK, EXIT_USAGE
from evaluator.formulas.loss import Loss, Rule
from evaluator.lossconfig.known import ANY, trainer_keys
from evaluator.lossconfig.resolve import trainer_config

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "trainer_configs"
AREAL, AREAL_M2PO, NEMO_RL, VERL = (
    CONFIGS / "areal-gsm8k_grpo.yaml",
    CONFIGS / "areal-gsm8k_m2po.yaml",
    CONFIGS / "nemo-rl" / "examples" / "configs" / "grpo_math_1B.yaml",
    CONFIGS / "verl-_generated_ppo_trainer.yaml",
)


def loss_from(path: Path):
    return CliRunner().invoke(cli, ["loss", "--loss-from", str(path)])


def write(tmp_path: Path, config: dict, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


def assert_usage_error(result, *fragments: str) -> None:
    assert result.exit_code == EXIT_USAGE, result.output
    for fragment in fragments:
        assert fragment in result.output, result.output
    assert "Traceback" not in result.output


def edited(path: Path, where: tuple[object, ...], change) -> dict:
    """The config at `path` with `change` applied to the mapping at `where` (keys and list indices)."""
    config = yaml.safe_load(path.read_text())
    node = config
    for step in where:
        node = node[step]
    change(node)
    return config


def renamed(old: str, new: str):
    return lambda node: node.__setitem__(new, node.pop(old))


class TestRealConfigs:
    def test_areal_example_loads_as_shipped(self):
        result = loss_from(AREAL)
        assert result.exit_code == EXIT_OK, result.output
        assert (
            "actor.eps_clip = 0.4" in result.output
            and "actor.rejection_sampling.upper = 5.0" in result.output
        )
        assert "actor.optimizer" in result.output  # known, read by nothing: listed as ignored
        assert trainer_config(AREAL).loss == Loss(eps_low=0.4, eps_high=0.4, rules=(Rule(upper=5.0),))

    def test_areal_m2po_example_loads_as_ppo_clipped_at_1(self):
        """AReaL's own M2PO example sets eps_clip 0.0: AReaL clamps the ratio to [1, 1] (no range check),
        and m2_threshold is read, not listed as ignored."""
        result = loss_from(AREAL_M2PO)
        assert result.exit_code == EXIT_OK, result.output
        read, ignored = result.output.split("ignored")
        assert "actor.eps_clip = 0.0" in read and "actor.m2_threshold = 0.04" in read
        assert "m2_threshold" not in ignored.split("note:")[0] and "[1, 1]" in ignored
        expected = Loss(eps_low=0.0, eps_high=0.0, m2_threshold=0.04, rules=(Rule(upper=5.0),))
        assert trainer_config(AREAL_M2PO).loss == expected

    def test_nemo_rl_example_loads_as_shipped(self):
        result = loss_from(NEMO_RL)
        assert result.exit_code == EXIT_OK, result.output
        assert trainer_config(NEMO_RL).loss == Loss(behave_weight="none", rules=())
        assert "loss_fn.ratio_clip_c" not in result.output.split("ignored")[1]  # null: read as unset

    def test_verl_reference_config_loads_as_shipped(self):
        result = loss_from(VERL)
        assert result.exit_code == EXIT_OK, result.output
        assert trainer_config(VERL).loss == Loss(dual_clip=3.0, behave_weight="none", rules=())

    def test_the_maximum_off_policyness_is_a_known_key(self, tmp_path):
        """AReaL's rollout.max_head_offpolicyness (2 in the example) is never flagged."""
        assert yaml.safe_load(AREAL.read_text())["rollout"]["max_head_offpolicyness"] == 2
        config = edited(AREAL, ("rollout",), lambda rollout: rollout.update(max_head_offpolicyness=8))
        assert loss_from(write(tmp_path, config)).exit_code == EXIT_OK


@pytest.mark.parametrize(
    "path, where, old, new, named, nearest",
    [
        (AREAL, ("actor",), "eps_clip", "eps_clp", "actor.eps_clp", "eps_clip"),
        (AREAL, ("actor", "rejection_sampling"), "upper", "uper", "actor.rejection_sampling.uper", "upper"),
        (AREAL, ("actor", "optimizer"), "lr", "lrr", "actor.optimizer.lrr", "lr"),
        (AREAL, ("actor", "scheduling_spec", 0), "gpu", "gpus", "actor.scheduling_spec[0].gpus", "gpu"),
        (AREAL, ("actor",), "rejection_sampling", "rejection_sampeling", "actor.rejection_sampeling",
         "rejection_sampling"),
        (VERL, ("actor_rollout_ref", "actor"), "clip_ratio_high", "clip_ratio_hgh",
         "actor_rollout_ref.actor.clip_ratio_hgh", "clip_ratio_high"),
        (VERL, ("actor_rollout_ref", "actor", "policy_loss"), "loss_mode", "loss_mod",
         "actor_rollout_ref.actor.policy_loss.loss_mod", "loss_mode"),
        (VERL, ("algorithm",), "rollout_correction", "rollout_corection", "algorithm.rollout_corection",
         "rollout_correction"),
        (VERL, ("algorithm", "rollout_correction"), "rollout_is", "rollout_iss",
         "algorithm.rollout_correction.rollout_iss", "rollout_is"),
        (NEMO_RL, ("loss_fn",), "ratio_clip_max", "ratio_clip_mx", "loss_fn.ratio_clip_mx", "ratio_clip_max"),
        (NEMO_RL, ("grpo",), "seq_logprob_error_threshold", "seq_logprob_eror_threshold",
         "grpo.seq_logprob_eror_threshold", "seq_logprob_error_threshold"),
        (AREAL_M2PO, ("actor",), "m2_threshold", "m2_treshold", "actor.m2_treshold", "m2_threshold"),
    ],
)  # fmt: skip
def test_a_misspelt_key_at_any_depth_names_it_and_its_nearest_known_key(
    tmp_path, path, where, old, new, named, nearest
):
    result = loss_from(write(tmp_path, edited(path, where, renamed(old, new))))
    assert_usage_error(result, str(tmp_path / "config.yaml"), f"{named}: unknown key")
    assert result.output.rstrip().endswith(f"the nearest known key is {nearest}")


def test_the_known_keys_are_the_trainers_schemas():
    """Each tree names its trainer's repository and a full commit, holds the keys proxaudit reads, and
    some it does not (read from the trainer's schema, not listed by hand)."""
    for name, section, read, other in (
        ("areal", "actor", ("eps_clip", "rejection_sampling", "m2_threshold"), ("optimizer", "mb_spec")),
        ("verl", "actor_rollout_ref", ("actor",), ("rollout", "ref")),
        ("nemo_rl", "loss_fn", ("ratio_clip_min", "use_cispo"), ("reference_policy_kl_penalty",)),
        ("nemo_rl", "grpo", ("seq_logprob_error_threshold",), ("num_prompts_per_step",)),
        ("nemo_rl", "ppo", ("seq_logprob_error_threshold",), ("ppo_epochs",)),
        ("prime_rl", "loss", ("dppo_mask_low", "kl_tau", "ipo_threshold"), ("import_path",)),
        ("prime_rl", "trainer.loss", ("type", "adv_tau"), ("kwargs",)),
        (
            "trl",
            "",
            ("loss_type", "epsilon_high", "vllm_importance_sampling_mode"),
            ("learning_rate", "model_name_or_path", "dataset_name"),
        ),  # TrainingArguments', ModelConfig's...
    ):
        keys = trainer_keys(name)
        assert len(keys.commit) == 40 and "/" in keys.repository
        assert set(read) | set(other) <= set(keys.sections[section])
    assert trainer_keys("verl").sections["actor_rollout_ref"]["rollout"] == ANY  # not read: any keys


@pytest.mark.parametrize(
    "legacy, migrated",
    [
        ({"behav_imp_weight_cap": 5.0}, {"metric": "ratio", "upper": 5.0}),
        ({"behave_imp_weight_cap": 3.0},
         {"level": "token", "action": "mask", "metric": "ratio", "upper": 3.0}),
        ({"behave_imp_weight_mode": "token_truncate", "behave_imp_weight_cap": 2.0},
         {"level": "token", "action": "clamp", "metric": "ratio", "upper": 2.0}),
        ({"behave_imp_weight_mode": "sequence_mask"},
         {"level": "sequence", "action": "mask", "metric": "ratio", "upper": 5.0}),
        ({"behave_imp_weight_mode": "sequence_truncate", "behave_imp_weight_cap": 4.0},
         {"level": "sequence", "action": "clamp", "metric": "ratio", "upper": 4.0}),
        ({"behave_imp_weight_mode": "disabled"}, None),
    ],
)  # fmt: skip
def test_areals_older_keys_map_as_its_migration_does(tmp_path, legacy, migrated):
    """The loss of an older AReaL's keys is the loss of the rejection_sampling table AReaL's migration
    message (`_LEGACY_MIGRATION_MESSAGE`, cbff54d) maps them to, and the output says so."""
    base = {"eps_clip": 0.2, "use_decoupled_loss": True}
    old = loss_from(write(tmp_path, {"actor": base | legacy}, "old.yaml"))
    assert old.exit_code == EXIT_OK, old.output
    assert "migration" in old.output and next(iter(legacy)) in old.output
    new = trainer_config(write(tmp_path, {"actor": base | {"rejection_sampling": migrated}}, "new.yaml"))
    assert trainer_config(tmp_path / "old.yaml").loss == new.loss


def test_behav_imp_weight_cap_null_keeps_the_weight_without_a_cap(tmp_path):
    """Before 03d71153a ppo_actor_loss_fn multiplied in the behaviour weight whatever the cap; null: none."""
    config = write(tmp_path, {"actor": {"behav_imp_weight_cap": None, "use_decoupled_loss": True}})
    assert trainer_config(config).loss == Loss(behave_weight="token", rules=())


@pytest.mark.parametrize(
    "actor, key",
    [
        ({"behave_imp_weight_cap": 5.0, "rejection_sampling": {"upper": 5.0}}, "actor.behave_imp_weight_cap"),
        ({"behav_imp_weight_cap": 5.0, "behave_imp_weight_cap": 5.0}, "actor.behav_imp_weight_cap"),
        ({"behave_imp_weight_mode": "disabled", "behave_imp_weight_cap": 5.0}, "actor.behave_imp_weight_cap"),
        ({"behave_imp_weight_mode": "token_drop"}, "actor.behave_imp_weight_mode"),
        ({"behave_imp_weight_cap": 0.5}, "actor.behave_imp_weight_cap"),
    ],
)
def test_older_keys_no_areal_version_accepts_are_usage_errors(tmp_path, actor, key):
    assert_usage_error(loss_from(write(tmp_path, {"actor": actor})), f"{key}:")


@pytest.mark.parametrize(
    "config, line",
    [
        ({"loss_type": "dapo", "beta": 0.04}, "beta (compares theta with the sampling or reference"),
        ({"algorithm": {"rollout_correction": {"rollout_is": "token", "rollout_is_batch_normalize": True}}},
         "algorithm.rollout_correction.rollout_is_batch_normalize (not modelled"),
        ({"loss_fn": {"disable_ppo_ratio": True}}, "loss_fn.disable_ppo_ratio (not modelled"),
    ],
)  # fmt: skip
def test_a_known_key_not_modelled_is_listed_with_its_reason(tmp_path, config, line):
    result = loss_from(write(tmp_path, config))
    assert result.exit_code == EXIT_OK, result.output
    assert line in result.output.split("ignored")[1]


@pytest.mark.parametrize(
    "name, text, named, nearest",
    [
        ("trl.yaml", "loss_type: dapo\nlearning_rate: 1.0e-6\nepsilon_hihg: 0.28\n", "epsilon_hihg",
         "epsilon_high"),
        ("trl.yaml", "epsilon: 0.2\nvllm_importance_sampling_mod: token_mask\n",
         "vllm_importance_sampling_mod", "vllm_importance_sampling_mode"),
        ("trainer.toml", "[loss]\ndppo_mask_hi = 0.3\n", "loss.dppo_mask_hi", "dppo_mask_high"),
        ("rl.toml", "[trainer.loss]\ntype = 'ipo'\nkl_ta = 0.001\n", "trainer.loss.kl_ta", "kl_tau"),
        ("verl.yaml", "actor_rollout_ref:\n  actor:\n    policy_loss:\n      loss_mode: dro\n"
         "      dro_bta: 0.1\n", "actor_rollout_ref.actor.policy_loss.dro_bta", "dro_beta"),
    ],
)  # fmt: skip
def test_a_misspelt_key_of_the_newer_readers_names_its_nearest_known_key(
    tmp_path, name, text, named, nearest
):
    """TRL's and prime-rl's keys (from their source at the pinned commit) and verl's newer keys (an explicit
    extra with its commit) are checked like the others."""
    path = tmp_path / name
    path.write_text(text)
    result = loss_from(path)
    assert_usage_error(result, str(path), f"{named}: unknown key")
    assert result.output.rstrip().endswith(f"the nearest known key is {nearest}")


def test_newer_keys_and_the_maximum_off_policyness_are_known(tmp_path):
    """verl's dro_beta (ddfbf4e), NeMo-RL's grpo.seq_logprob_error_threshold (14f9f38) and TRL's
    max_staleness load."""
    for name, config in (
        (
            "verl.yaml",
            {"actor_rollout_ref": {"actor": {"policy_loss": {"loss_mode": "dro", "dro_beta": 0.1}}}},
        ),
        ("nemo.yaml", {"loss_fn": {}, "grpo": {"seq_logprob_error_threshold": 2.0}}),
        ("trl.yaml", {"loss_type": "dapo", "max_staleness": 4}),
    ):
        assert loss_from(write(tmp_path, config, name)).exit_code == EXIT_OK, name


def _sections(tree: dict, path: str = "") -> list[tuple[str, dict]]:
    """(dotted path, keys) of every mapping of a tree of known keys."""
    out = [(path, tree)]
    for key, below in tree.items():
        if isinstance(below, dict):
            out += _sections(below, f"{path}.{key}" if path else key)
    return out


AREAL_SECTIONS = _sections(trainer_keys("areal").sections)[1:]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(section=st.sampled_from(AREAL_SECTIONS), key=st.text(min_size=1, max_size=30))
def test_any_key_outside_the_schema_is_refused_never_skipped(tmp_path, section, key):
    """A key of any text that AReaL's schema lacks, put into any mapping of `actor:`, is exit 2 naming it."""
    path, known = section
    if key in known or key == "<<" or (path == "actor" and key.startswith(("behav_imp", "behave_imp"))):
        return
    config: dict = {}
    node = config
    for step in path.split("."):
        node = node.setdefault(step, {})
    node[key] = 1
    result = loss_from(write(tmp_path, config))
    assert result.exit_code == EXIT_USAGE, result.output
    assert f"{path}." in result.output and "unknown key" in result.output and "Traceback" not in result.output


NAMES = sorted(
    {
        "actor",
        "algorithm",
        "actor_rollout_ref",
        "loss_fn",
        "rollout_correction",
        "policy_loss",
        "rejection_sampling",
        "loss_mode",
        "dro_beta",
        "seq_logprob_error_threshold",
    }
    | set(trainer_keys("areal").sections["actor"])
    | set(trainer_keys("verl").sections["algorithm"]["rollout_correction"])
    | set(trainer_keys("nemo_rl").sections["loss_fn"])
)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.floats(), st.integers(-(10**30), 10**30), st.text(max_size=12),
    st.sampled_from(["token", "sequence", "seq_sum_k1,token_k2", "1.5_2", "gspo", "${x}", "clamp", "dro",
                     "dppo_tv", "geo_mean", "cispo", "sequence_truncate"]),
)  # fmt: skip
CONFIGS_OF_ANY_SHAPE = st.dictionaries(
    st.sampled_from(
        [
            "actor",
            "algorithm",
            "actor_rollout_ref",
            "loss_fn",
            "rollout",
            "grpo",
            "loss_type",
            "epsilon",
            "vllm_importance_sampling_mode",
        ]
    ),
    st.recursive(
        SCALARS,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(NAMES), inner, max_size=4)
        ),
        max_leaves=12,
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=CONFIGS_OF_ANY_SHAPE)
def test_a_config_of_any_shape_is_read_or_refused_never_a_traceback(tmp_path, config):
    """The trainers' real key names in any nesting, with values of any type: exit 0 or a one-line usage
    error naming the file, never a traceback."""
    path = write(tmp_path, config)
    result = loss_from(path)
    assert result.exit_code in (EXIT_OK, EXIT_USAGE), result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), (
        result.output
    )
    if result.exit_code == EXIT_USAGE:
        assert str(path) in result.output and len(result.output.splitlines()) <= 3, result.output
