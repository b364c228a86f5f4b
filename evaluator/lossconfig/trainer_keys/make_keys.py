"""Write `{trainer}.json` beside this file: the keys a trainer's config may hold in the sections proxaudit
reads, read from the trainer's own source at one commit, never listed by hand (not run by proxaudit:
run it again to follow a new commit of the trainer, then read the diff).

    python evaluator/lossconfig/trainer_keys/make_keys.py TRAINER CLONE [COMMIT]

TRAINER is areal, verl, nemo_rl, prime_rl or trl; CLONE a git clone of its repository (`PINNED`), COMMIT
the commit to read (default: the pinned one).

A section is a tree: each key maps to null (a value: a number, a string, a list of values), "*" (a
mapping of any keys: a `dict` field, or a section proxaudit does not read), a mapping of the keys below it
(a dataclass field), or a list holding one such mapping (a list of dataclasses).
- AReaL: `actor` is `PPOActorConfig` of `areal/api/cli_args.py`, its fields' dataclasses expanded.
- verl: the `actor_rollout_ref.actor` and `algorithm` subtrees of `_generated_ppo_trainer.yaml` and
  `_generated_ppo_megatron_trainer.yaml` (verl/trainer/config), each mapping joined with the fields of
  the dataclass its `_target_` names (any dataclass of `verl/`); the other subsections of
  `actor_rollout_ref` and `algorithm` (not read) take any keys.
- NeMo-RL: `loss_fn` is `ClippedPGLossConfig` of `nemo_rl/algorithms/loss/loss_functions.py`, `grpo`
  `GRPOConfig` of `nemo_rl/algorithms/grpo.py`, `ppo` `PPOConfig` of `nemo_rl/algorithms/ppo.py`; joined
  with the keys those sections hold in NeMo-RL's own GRPO and PPO example configs (the YAML files under
  `examples/` with a `grpo` or `ppo` section, whose `loss_fn` is a `ClippedPGLossConfig`): its
  TypedDicts are not total and do not declare every key its examples ship (`grpo.penalize_invalid_tool_call`,
  `zero_variance_prompt_filtering`, ...), and refusing a trainer's shipped example would be a false alarm.
  The keys so added are listed under `from_examples`.
- prime-rl: `loss` (a trainer config) and `trainer.loss` (an rl config) are the `LossConfig` union of
  `packages/prime-rl-configs/src/prime_rl/configs/trainer.py`: the keys of any of its loss configs.
- TRL: the top level of a `trl grpo --config` YAML holds the fields of the dataclasses `trl/scripts/grpo.py`
  parses (GRPOScriptArguments, GRPOConfig, ModelConfig, DatasetMixtureConfig) and `env`; GRPOConfig's base
  is transformers' TrainingArguments, read from the installed transformers (the release
  requirements-trainers.txt pins), as a release pins its source as a commit does.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Callable
from importlib.metadata import version
from importlib.util import find_spec
from pathlib import Path

import yaml

LEAF, ANY = None, "*"


def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout


def dataclasses(sources: list[str]) -> dict[str, tuple[list[str], dict[str, ast.expr]]]:
    """Class name -> (base names, {field: annotation}) of every class of the sources (fields: annotated
    names of the class body, ClassVars left out); a name defined twice has both classes' fields."""
    found: dict[str, tuple[list[str], dict[str, ast.expr]]] = {}
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.ClassDef):
                continue
            fields = {
                s.target.id: s.annotation
                for s in node.body
                if isinstance(s, ast.AnnAssign)
                and isinstance(s.target, ast.Name)
                and "ClassVar" not in ast.unparse(s.annotation)
            }
            bases, known = found.get(node.name, ([], {}))
            found[node.name] = (bases + [ast.unparse(b).split(".")[-1] for b in node.bases], known | fields)
    return found


def fields(classes: dict, name: str) -> dict[str, ast.expr]:
    """The fields of class `name` and of its bases (base first)."""
    if name not in classes:
        return {}
    bases, own = classes[name]
    out: dict[str, ast.expr] = {}
    for base in bases:
        out |= fields(classes, base)
    return out | own


def _parts(annotation: ast.expr) -> list[ast.expr]:
    """The types of an annotation, `Optional[X]` and `X | Y | None` taken apart, None left out."""
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return _parts(annotation.left) + _parts(annotation.right)
    if isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) in (
        "Optional",
        "typing.Optional",
    ):
        return _parts(annotation.slice)
    return [] if ast.unparse(annotation) == "None" else [annotation]


def spec(classes: dict, annotation: ast.expr) -> object:
    """A field's tree from its annotation: a dataclass's keys, a list of them, any keys, or a value."""
    for part in _parts(annotation):
        outer = ast.unparse(part.value if isinstance(part, ast.Subscript) else part).split(".")[-1]
        if outer in ("dict", "Dict", "Any", "DictConfig", "Mapping"):
            return ANY
        inner = [n.id for n in ast.walk(part) if isinstance(n, ast.Name) and n.id in classes]
        if inner and set(fields(classes, inner[0])) <= {"_target_"}:
            return ANY  # verl's BaseConfig: whatever the code puts there
        if inner:
            keys = tree(classes, inner[0])
            return [keys] if outer in ("list", "List", "tuple", "Tuple") else keys
    return LEAF


def tree(classes: dict, name: str) -> dict:
    return {key: spec(classes, annotation) for key, annotation in fields(classes, name).items()}


def joined(classes: dict, values: list[object], annotation: ast.expr | None = None) -> object:
    """The tree of one mapping of the generated configs (its values in each config): its keys, joined
    with the fields of the dataclass `_target_` names (or the field's annotation), each key likewise."""
    mappings = [v for v in values if isinstance(v, dict)]
    targets = {str(m["_target_"]).split(".")[-1] for m in mappings if "_target_" in m}
    by_field: dict[str, ast.expr] = {}
    for target in sorted(targets):
        by_field |= fields(classes, target)
    if not mappings:
        return spec(classes, annotation) if annotation is not None else LEAF
    if by_field:
        by_field.setdefault("_target_", ast.Name("str"))
    elif annotation is not None and spec(classes, annotation) == ANY:
        return ANY
    keys = list(dict.fromkeys([k for m in mappings for k in m] + list(by_field)))
    return {k: joined(classes, [m.get(k) for m in mappings], by_field.get(k)) for k in keys}


def dataclass_sections(trainer: str, roots: dict[str, tuple[str, str]]) -> Callable[[str, str], dict]:
    """The reader of a trainer whose sections are each one dataclass: section -> (file, class)."""

    def read(repo: str, commit: str) -> dict:
        sections = {}
        for section, (path, root) in roots.items():
            sections[section] = tree(dataclasses([git(repo, "show", f"{commit}:{path}")]), root)
        read_from = "; ".join(
            f"{path}: {root} and the dataclasses of its fields" for path, root in roots.values()
        )
        return {"trainer": trainer, "read_from": read_from, "sections": sections}

    return read


def with_examples(
    read: Callable[[str, str], dict], folder: str, kinds: tuple[str, ...]
) -> Callable[[str, str], dict]:
    """`read`, its sections joined with the keys they hold in the trainer's example configs at the commit:
    the YAML files under `folder` whose top level holds one of `kinds` (the algorithms whose configs the
    sections describe). The keys added are listed, dotted, in `from_examples`."""

    def joined_read(repo: str, commit: str) -> dict:
        keys = read(repo, commit)
        files = git(repo, "ls-tree", "-r", "--name-only", commit).split()
        paths = [p for p in files if p.startswith(f"{folder}/") and p.endswith((".yaml", ".yml"))]
        configs = [yaml.safe_load(git(repo, "show", f"{commit}:{p}")) for p in paths]
        examples = [c for c in configs if isinstance(c, dict) and any(k in c for k in kinds)]
        added: list[str] = []
        for config in examples:
            for section, tree in keys["sections"].items():
                values = config.get(section)
                if isinstance(values, dict) and isinstance(tree, dict):
                    added += add_keys(tree, values, section)
        keys["read_from"] += (
            f"; with the keys of these sections in its {len(examples)} example configs that hold "
            f"{' or '.join(kinds)} ({folder}/)"
        )
        keys["from_examples"] = sorted(set(added))
        return keys

    return joined_read


def add_keys(tree: dict, values: dict, path: str) -> list[str]:
    """Add to `tree` the keys of the config mapping `values` it lacks (a mapping's keys below it, any other
    value a leaf), at any depth; the dotted paths of those added."""
    added = []
    for key, value in values.items():
        name = f"{path}.{key}"
        if key not in tree:
            tree[key] = {} if isinstance(value, dict) else LEAF
            added.append(name)
        if isinstance(tree[key], dict) and isinstance(value, dict):
            added += add_keys(tree[key], value, name)
    return added


def prime_rl(repo: str, commit: str) -> dict:
    path = "packages/prime-rl-configs/src/prime_rl/configs/trainer.py"
    source = git(repo, "show", f"{commit}:{path}")
    classes = dataclasses([source])
    union = next(
        n.value
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.AnnAssign) and ast.unparse(n.target) == "LossConfig"
    )
    loss: dict = {}
    for name in [n.id for n in ast.walk(union) if isinstance(n, ast.Name) and n.id in classes]:
        loss |= tree(classes, name)
    return {
        "trainer": "prime-rl",
        "read_from": f"{path}: the loss configs of LossConfig ([loss] of a trainer config, [trainer.loss] "
        "of an rl config)",
        "sections": {"loss": loss, "trainer.loss": loss},
    }


def trl(repo: str, commit: str) -> dict:
    paths = ["trl/scripts/grpo.py", "trl/scripts/utils.py", "trl/trainer/grpo_config.py",
             "trl/trainer/base_config.py", "trl/trainer/model_config.py"]  # fmt: skip
    training_args = Path(find_spec("transformers").origin).with_name("training_args.py")
    classes = dataclasses([git(repo, "show", f"{commit}:{p}") for p in paths] + [training_args.read_text()])
    top: dict = {"env": ANY}  # TrlParser sets it as environment variables
    for name in ("GRPOScriptArguments", "GRPOConfig", "ModelConfig", "DatasetMixtureConfig"):
        top |= tree(classes, name)
    return {
        "trainer": "TRL",
        "read_from": f"{', '.join(paths)}: the dataclasses trl grpo parses, with transformers "
        f"{version('transformers')} training_args.py TrainingArguments",
        "sections": {"": top},
    }


def verl(repo: str, commit: str) -> dict:
    paths = [
        p for p in git(repo, "ls-tree", "-r", "--name-only", commit, "verl").split() if p.endswith(".py")
    ]
    classes = dataclasses([git(repo, "show", f"{commit}:{p}") for p in paths])
    configs = [
        yaml.safe_load(git(repo, "show", f"{commit}:verl/trainer/config/_generated_{name}.yaml"))
        for name in ("ppo_trainer", "ppo_megatron_trainer")
    ]
    roots = [c["actor_rollout_ref"] for c in configs]
    algorithms = [c["algorithm"] for c in configs]
    outer = {k: ANY if isinstance(roots[0][k], dict) else LEAF for r in roots for k in r}
    algorithm = {k: ANY if isinstance(v, dict) else LEAF for a in algorithms for k, v in a.items()}
    correction = joined(
        classes, [a["rollout_correction"] for a in algorithms], ast.Name("RolloutCorrectionConfig")
    )
    for key, annotation in fields(classes, "AlgoConfig").items():
        algorithm.setdefault(key, ANY if spec(classes, annotation) not in (LEAF,) else LEAF)
    return {
        "trainer": "verl",
        "read_from": "verl/trainer/config/_generated_ppo_trainer.yaml and "
        "_generated_ppo_megatron_trainer.yaml (actor_rollout_ref.actor, algorithm), with the dataclasses "
        "their _target_ names",
        "sections": {
            "actor_rollout_ref": outer | {"actor": joined(classes, [r["actor"] for r in roots])},
            "algorithm": algorithm | {"rollout_correction": correction},
        },
    }


READERS = {
    "areal": dataclass_sections("AReaL", {"actor": ("areal/api/cli_args.py", "PPOActorConfig")}),
    "verl": verl,
    "nemo_rl": with_examples(
        dataclass_sections(
            "NeMo-RL",
            {
                "loss_fn": ("nemo_rl/algorithms/loss/loss_functions.py", "ClippedPGLossConfig"),
                "grpo": ("nemo_rl/algorithms/grpo.py", "GRPOConfig"),
                "ppo": ("nemo_rl/algorithms/ppo.py", "PPOConfig"),
            },
        ),
        "examples",
        ("grpo", "ppo"),
    ),
    "prime_rl": prime_rl,
    "trl": trl,
}
PINNED = {
    "areal": ("areal-project/AReaL", "cbff54d645d2cd8ee1f1c358a82f3f473588433d"),
    "verl": ("volcengine/verl", "b178a3cd56f58b2d502255daba591e92833930a7"),
    "nemo_rl": ("NVIDIA-NeMo/RL", "7ea279abfbeb698b092856d0dab61e7cf39bc909"),
    "prime_rl": ("PrimeIntellect-ai/prime-rl", "559b44772e471d1538537b8805cc77f3824a5e64"),
    "trl": ("huggingface/trl", "f2cd57710ae345ea6428ae95363267fcf38a3dc8"),
}
"""Each trainer's repository and the commit proxaudit's readers follow (docs/metrics.md)."""


def main(trainer: str, clone: str, commit: str | None = None) -> None:
    repository, pinned = PINNED[trainer]
    commit = git(clone, "rev-parse", f"{commit or pinned}^{{commit}}").strip()
    keys = READERS[trainer](clone, commit)
    out = Path(__file__).with_name(f"{trainer}.json")
    out.write_text(json.dumps({"repository": repository, "commit": commit, **keys}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
