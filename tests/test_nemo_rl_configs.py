"""NeMo-RL's example configs as NeMo-RL loads them (fixtures/trainer_configs/nemo-rl, byte for byte from
NVIDIA-NeMo/RL@7ea279a): each recipe merged over the parents its `defaults` names, against NeMo-RL's own
loader run on OmegaConf; the `grpo` keys its examples ship but its TypedDicts do not declare are known,
while a typo of them is exit 2 naming the nearest; `3e-4` is a float, as OmegaConf reads it."""

from __future__ import annotations

import json
import shutil
from importlib.resources import files
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from evaluator.cli import cli
from evaluator.cli.common import EXIT_OK, EXIT_USAGE
from evaluator.formulas.loss import Loss, Rule
from evaluator.lossconfig.inherit import DEPTH, inherited
from evaluator.lossconfig.known import trainer_keys
from evaluator.lossconfig.resolve import trainer_config
from evaluator.lossconfig.yaml_file import load_yaml

NEMO_RL = Path(__file__).resolve().parents[1] / "fixtures" / "trainer_configs" / "nemo-rl"
RECIPES = {  # a recipe: (the key NeMo-RL's GRPOConfig does not declare, or None; the loss NeMo-RL runs)
    "examples/configs/recipes/vlm/vlm_grpo-nemotron-omni-30ba3b-mmpr-4n8g-megatron-tp8ep16.v1.yaml": (
        "zero_variance_prompt_filtering",
        Loss(eps_high=0.28, ratio_level="sequence", behave_weight="none", rules=()),
    ),
    "examples/configs/recipes/vlm/vlm_grpo-nemotron-omni-30ba3b-circle-click-2n8g-megatron-tp2ep8.v1.yaml": (
        "num_val_generations_per_prompt",  # ratio_clip_min 0.2 from grpo_math_1B.yaml, two levels up
        Loss(eps_high=0.28, behave_weight="token", rules=(Rule("sequence", "mult_prob_error", upper=2.0),)),
    ),
    "examples/configs/recipes/vlm/"
    "vlm_grpo-nemotron-super-omni-120ba12b-16n8g-megatron-tp8ep16cp2-async-gym.v1.yaml": (
        "zero_variance_prompt_filtering",
        None,  # the loss is asserted by test_inherited_loss_keys_are_read
    ),
    "examples/nemo_gym/grpo_qwen3_30ba3b_instruct.yaml": (  # ratio_clip_min: 3e-4
        None,
        Loss(eps_low=3e-4, eps_high=3e-4, ratio_level="sequence", behave_weight="none", rules=()),
    ),
}


def loss_from(path: Path):
    return CliRunner().invoke(cli, ["loss", "--loss-from", str(path)])


def nemo_rl_load(path: Path) -> dict:
    """NeMo-RL's load_config_with_inheritance and merge_with_override (`nemo_rl/utils/config.py` at
    7ea279a), on OmegaConf, as a plain dict (interpolations unresolved)."""
    omegaconf = pytest.importorskip("omegaconf")
    conf, dict_config = omegaconf.OmegaConf, omegaconf.DictConfig

    def merge(base, over):
        for key in list(over.keys()):
            if conf.is_missing(over, key):
                continue
            if isinstance(over[key], dict_config) and over[key].get("_override_", False):
                over[key].pop("_override_")
                if key in base:
                    base.pop(key)
        return conf.merge(base, over)

    def load(path: Path):
        config = conf.load(path)
        if "defaults" in config:
            defaults = config.pop("defaults")
            defaults = [defaults] if isinstance(defaults, str) else [str(d) for d in defaults]
            base = conf.create({})
            for default in defaults:
                base = merge(base, load(path.parent / default))
            config = merge(base, config)
        return config

    return conf.to_container(load(path), resolve=False)


@pytest.mark.parametrize("recipe", list(RECIPES), ids=lambda r: Path(r).stem[:40])
def test_a_recipe_is_merged_over_its_parents_as_nemo_rl_loads_it(recipe):
    path = NEMO_RL / recipe
    assert inherited(load_yaml(path, "config"), path) == nemo_rl_load(path)


@pytest.mark.parametrize("recipe", list(RECIPES), ids=lambda r: Path(r).stem[:40])
def test_every_recipe_loads_with_the_loss_nemo_rl_runs(recipe):
    undeclared, expected = RECIPES[recipe]
    result = loss_from(NEMO_RL / recipe)
    assert result.exit_code == EXIT_OK, result.output
    assert "note: defaults: " in result.output and "read merged over it as NeMo-RL loads it" in result.output
    if expected is not None:
        assert trainer_config(NEMO_RL / recipe).loss == expected
    if undeclared is not None:
        keys = trainer_keys("nemo_rl")
        assert f"grpo.{undeclared}" in keys.from_examples and undeclared in keys.sections["grpo"]
        assert undeclared in yaml.safe_load((NEMO_RL / recipe).read_text())["grpo"]


def test_inherited_loss_keys_are_read():
    """The async-gym recipe sets the truncation (TIS to [0.5, 2]); its parent grpo_nanov3.yaml turns the
    importance sampling correction on and sets seq_logprob_error_threshold 2: read alone, the recipe's
    truncation would apply to no weight and its sequences would not be masked."""
    path = NEMO_RL / list(RECIPES)[2]
    own = yaml.safe_load(path.read_text())
    assert "use_importance_sampling_correction" not in own["loss_fn"]
    assert "seq_logprob_error_threshold" not in own["grpo"]
    parent = yaml.safe_load((NEMO_RL / "examples/nemo_gym/grpo_nanov3.yaml").read_text())
    assert parent["loss_fn"]["use_importance_sampling_correction"] is True
    assert parent["grpo"]["seq_logprob_error_threshold"] == 2
    assert trainer_config(path).loss == Loss(
        eps_high=0.28,
        behave_weight="token",
        rules=(
            Rule("token", "ratio", lower=0.5, upper=2.0, action="clamp"),
            Rule("sequence", "mult_prob_error", upper=2.0),
        ),
    )


@pytest.mark.parametrize(
    "key, typo", [("zero_variance_prompt_filtering", "zero_variance_prompt_filterng"),
                  ("num_val_generations_per_prompt", "num_val_generation_per_prompt")],
)  # fmt: skip
def test_a_typo_of_a_key_the_examples_ship_is_still_refused(tmp_path, key, typo):
    tree = tmp_path / "nemo-rl"
    shutil.copytree(NEMO_RL, tree)
    recipe = next(tree / r for r, (k, _) in RECIPES.items() if k == key)
    recipe.write_text(recipe.read_text().replace(f"  {key}:", f"  {typo}:"))
    result = loss_from(recipe)
    assert result.exit_code == EXIT_USAGE, result.output
    assert f"{recipe}: grpo.{typo}: unknown key: not in NeMo-RL's config schema or its example configs" in (
        result.output
    )
    assert result.output.rstrip().endswith(f"the nearest known key is {key}")


def test_the_known_keys_say_which_came_from_the_examples():
    keys = trainer_keys("nemo_rl")
    document = json.loads((files("evaluator.lossconfig") / "trainer_keys" / "nemo_rl.json").read_text())
    assert "example configs that hold grpo or ppo (examples/)" in document["read_from"]
    assert all(k.split(".", 1)[1] in keys.sections[k.split(".")[0]] for k in keys.from_examples)
    assert not any(k.startswith("loss_fn.") for k in keys.from_examples)  # ClippedPGLossConfig declares all


def write(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


class TestInheritance:
    def test_a_child_key_wins_and_a_parent_key_is_read(self, tmp_path):
        write(tmp_path / "parent.yaml", {"loss_fn": {"ratio_clip_min": 0.1, "ratio_clip_max": 0.2}})
        child = write(
            tmp_path / "child.yaml", {"defaults": "parent.yaml", "loss_fn": {"ratio_clip_max": 0.3}}
        )
        assert trainer_config(child).loss == Loss(eps_low=0.1, eps_high=0.3, behave_weight="none", rules=())

    def test_override_replaces_and_missing_keeps_the_parent(self, tmp_path):
        write(tmp_path / "a.yaml", {"data": {"x": 1, "y": 2}, "grpo": {"seed": 1}, "loss_fn": {}})
        child = {"defaults": ["a.yaml"], "data": {"_override_": True, "z": 3}, "grpo": {"seed": "???"}}
        merged = inherited(child, tmp_path / "child.yaml")
        assert merged["data"] == {"z": 3} and merged["grpo"] == {"seed": 1}
        assert merged == nemo_rl_load(write(tmp_path / "child.yaml", child))

    def test_a_cycle_is_refused(self, tmp_path):
        write(tmp_path / "a.yaml", {"defaults": "b.yaml", "loss_fn": {}})
        write(tmp_path / "b.yaml", {"defaults": "a.yaml"})
        result = loss_from(tmp_path / "a.yaml")
        assert (
            result.exit_code == EXIT_USAGE and f"more than {DEPTH} levels of parent configs" in result.output
        )

    def test_a_missing_parent_is_named(self, tmp_path):
        child = write(tmp_path / "c.yaml", {"defaults": "../gone.yaml", "loss_fn": {}})
        result = loss_from(child)
        assert (
            result.exit_code == EXIT_USAGE
            and "gone.yaml" in result.output
            and "Traceback" not in result.output
        )

    def test_hydra_defaults_are_not_nemo_rl_s(self, tmp_path):
        """verl's Hydra `defaults` list names config groups, no file: left as it is."""
        config = {"defaults": ["_self_", {"actor@actor_rollout_ref.actor": "dp_actor"}], "algorithm": {}}
        assert inherited(config, tmp_path / "v.yaml") == config


@pytest.mark.parametrize("text", ["3e-4", "-3E+4", "1.0e4", ".5e-3", "1_000e2", "1e", "0x1e3", "'3e-4'"])
def test_numbers_are_read_as_omegaconf_reads_them(tmp_path, text):
    conf = pytest.importorskip("omegaconf").OmegaConf
    path = tmp_path / "c.yaml"
    path.write_text(f"a: {text}\n")
    value, expected = load_yaml(path, "config")["a"], conf.load(path)["a"]
    assert value == expected and type(value) is type(expected)
