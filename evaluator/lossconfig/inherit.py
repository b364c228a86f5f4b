"""NeMo-RL's config inheritance, as `nemo_rl/utils/config.py` load_config_with_inheritance does it (NeMo-RL
7ea279a): a config whose `defaults` names YAML files (a path, or a list of them, relative to the config's
folder) is merged over them, each parent resolved the same way first, left to right. Mappings merge key by
key (OmegaConf.merge), other values replace; a top-level mapping marked `_override_: true` replaces the
parent's instead, and a `???` value (OmegaConf's missing) keeps the parent's. Most of NeMo-RL's recipes
set a few keys over a parent: read alone, their loss would be half NeMo-RL's and half proxaudit's defaults.

Hydra's `defaults` lists (verl's: `_self_`, `group: option` entries) name no YAML file and are left as they
are. Parents are read as the config is (`yaml_file.load_yaml`: bounded, safe), at most `DEPTH` deep."""

from __future__ import annotations

from pathlib import Path

from evaluator.errors import UsageError
from evaluator.lossconfig.yaml_file import load_yaml

DEPTH = 16
"""The most levels of parents (NeMo-RL's recipes use 3); a deeper chain is refused as a likely cycle."""
MISSING = "???"
OVERRIDE = "_override_"


def parents(config: dict) -> list[str]:
    """The YAML files `config`'s NeMo-RL `defaults` names, in order; none for any other `defaults`."""
    names = config.get("defaults")
    names = [names] if isinstance(names, str) else names
    all_yaml = isinstance(names, list) and all(
        isinstance(n, str) and n.endswith((".yaml", ".yml")) for n in names
    )
    return names if all_yaml and names else []


def inherited(config: dict, path: str | Path, depth: int = 0) -> dict:
    """`config` (read from `path`) merged over the parents its `defaults` names, as NeMo-RL merges them."""
    names = parents(config)
    if not names:
        return config
    if depth >= DEPTH:
        raise UsageError(f"{path}: defaults: more than {DEPTH} levels of parent configs (a cycle?)")
    base: dict = {}
    for name in names:
        parent = Path(name) if name.startswith("/") else Path(path).parent / name
        loaded = load_yaml(parent, f"parent config of {path} (defaults)")
        if not isinstance(loaded, dict):
            raise UsageError(f"{parent}: the parent config of {path} (defaults) is not a mapping of keys")
        base = merged(base, inherited(loaded, parent, depth + 1), top=True)
    return merged(base, {k: v for k, v in config.items() if k != "defaults"}, top=True)


def merged(base: dict, over: dict, top: bool = False) -> dict:
    """`over` merged into `base` (neither is changed): OmegaConf.merge, with NeMo-RL's top-level
    `_override_`."""
    out = dict(base)
    for key, value in over.items():
        if value == MISSING and key in out:
            continue
        if top and isinstance(value, dict) and value.get(OVERRIDE) is True:
            out[key] = {k: v for k, v in value.items() if k != OVERRIDE}
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out
