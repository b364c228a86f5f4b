"""Which loss a replay computes its decisions under: `--loss NAME|FILE.toml`, or `--loss-from` a trainer's
config, then the shorthands (`--eps-low`, `--eps-high`, `--bound`, `--bound-action`)."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from evaluator.errors import ParameterError, UsageError
from evaluator.formulas.loss import Loss
from evaluator.inputs import read_text
from evaluator.lossconfig.areal import areal_loss
from evaluator.lossconfig.inherit import inherited, parents
from evaluator.lossconfig.others import TRL_KEYS, Read, prime_rl_loss, trl_loss
from evaluator.lossconfig.presets import PRESETS
from evaluator.lossconfig.staleness import DOTTED_KEYS, max_staleness
from evaluator.lossconfig.toml_file import bound_rule, toml_loss
from evaluator.lossconfig.verl import nemo_rl_loss, verl_loss
from evaluator.lossconfig.yaml_file import load_yaml
from evaluator.text_table import printable


@dataclass(frozen=True)
class LossChoice:
    """The loss, and what was read to get it: config keys used and ignored, and notes for the user; the
    trainer's maximum staleness where its config has it (`staleness.max_staleness`)."""

    loss: Loss
    used: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    max_staleness: tuple[int, str, str] | None = None

    def lines(self) -> list[str]:
        """What to tell the user: the loss in one line, then the keys read and ignored, then the notes."""
        out = [f"loss: {self.loss.describe()} ({printable(self.loss.name)})"]
        if self.used:
            out.append("  read: " + ", ".join(map(printable, self.used)))
        if self.ignored:
            out.append(
                "  ignored (they shape no decision proxaudit models): "
                + ", ".join(map(printable, self.ignored))
            )
        out += [f"  note: {printable(n)}" for n in self.notes]
        if self.max_staleness is not None:
            out.append(
                f"  max staleness: {printable(self.max_staleness[1])}: the gate judges staleness 1 to it"
            )
        return out


def _prime_rl_toml(path: str | Path) -> LossChoice:
    """prime-rl's TOML config: a trainer config's `[loss]`, or an rl config's `[trainer.loss]` (none: the
    default loss, as prime-rl runs it)."""
    try:
        config = tomllib.loads(read_text(path, "--loss-from config"))
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"--loss-from {path}: cannot read it as TOML: {error}") from None
    if config.get("loss") is None and not isinstance(config.get("trainer"), dict):
        raise UsageError(
            f"--loss-from {path}: a TOML config needs prime-rl's [loss] table (a trainer config) or "
            "[trainer] tables (an rl config)"
        )
    return _choice(prime_rl_loss(config, str(path)), config, path, "prime-rl")


def trainer_config(path: str | Path) -> LossChoice:
    """The loss of a trainer's experiment config (YAML or JSON): AReaL's (an `actor:` section), verl's
    (`algorithm` / `actor_rollout_ref`), NeMo-RL's (`loss_fn`, merged over the parents its `defaults`
    names) or TRL's (GRPOConfig keys at the top); prime-rl's TOML."""
    if Path(path).suffix == ".toml":
        return _prime_rl_toml(path)
    config = load_yaml(path, "--loss-from config")
    if not isinstance(config, dict):
        raise UsageError(f"--loss-from {path}: not a mapping of config keys")
    names = parents(config)
    config = inherited(config, path)
    if isinstance(config.get("actor"), dict):
        reader, trainer = areal_loss, "AReaL"
    elif isinstance(config.get("actor_rollout_ref"), dict) or isinstance(config.get("algorithm"), dict):
        reader, trainer = verl_loss, "verl"
    elif isinstance(config.get("loss_fn"), dict):
        reader, trainer = nemo_rl_loss, "NeMo-RL"
    elif any(key in config for key in TRL_KEYS):
        reader, trainer = trl_loss, "TRL"
    else:
        raise UsageError(
            f"--loss-from {path}: neither AReaL's (actor:), verl's (algorithm:, actor_rollout_ref:), "
            "NeMo-RL's (loss_fn:), TRL's (loss_type:, epsilon:, vllm_importance_sampling_*:) nor prime-rl's "
            "(a TOML [loss] table) config; describe the loss in a TOML file for --loss instead"
        )
    merge = f"defaults: {', '.join(names)}: read merged over it as NeMo-RL loads it" if names else None
    return _choice(reader(config, str(path)), config, path, trainer, merge)


def _choice(read: Read, config: dict, path: str | Path, trainer: str, note: str | None = None) -> LossChoice:
    """A reader's loss with the maximum staleness `trainer`'s config has (`staleness.max_staleness`): its
    key is read, hence not listed as ignored; `note` first among the notes."""
    loss, used, ignored, notes = read
    ignored = [key for key in ignored if key.split(" (")[0] not in DOTTED_KEYS]
    notes = [note, *notes] if note else notes
    return LossChoice(loss, used, ignored, notes, max_staleness(config, str(path), trainer))


FLAGS = {"eps_low": "--eps-low", "eps_high": "--eps-high", "upper": "--bound", "rules": "--bound"}
"""The flag behind each field of the loss the shorthands set."""


def resolve(
    loss: str | None = None,
    loss_from: str | None = None,
    *,
    eps_low: float | None = None,
    eps_high: float | None = None,
    bound: float | None = None,
    bound_action: str | None = None,
) -> LossChoice:
    """The loss of the command line: a preset name or a TOML file (`loss`), or a trainer's config
    (`loss_from`), the default otherwise; then the shorthands, which win."""
    if loss is not None and loss_from is not None:
        raise UsageError("give --loss or --loss-from, not both")
    if loss_from is not None:
        choice = trainer_config(loss_from)
    elif loss is None or loss in PRESETS:
        choice = LossChoice(PRESETS[loss or "default"])
    elif os.path.lexists(loss):
        choice = LossChoice(toml_loss(loss))
    else:
        raise UsageError(f"--loss {loss!r}: neither a preset ({', '.join(PRESETS)}) nor a file")
    keys: dict = {k: v for k, v in (("eps_low", eps_low), ("eps_high", eps_high)) if v is not None}
    if bound is not None or bound_action is not None:  # one token ratio rule; the loss's own fills the gaps
        own = [r for r in choice.loss.rules if (r.level, r.statistic) == ("token", "ratio")]
        upper = bound if bound is not None else own[0].upper if own and own[0].upper else 5.0
        action = bound_action or (own[0].action if own else "mask")
        keys |= {"behave_weight": "token", "rules": (bound_rule(upper, action),)}
    if not keys:
        return choice
    try:
        return replace(choice, loss=replace(choice.loss, **keys))
    except ParameterError as error:
        flag = FLAGS.get(error.key, "--eps-low/--eps-high/--bound")
        raise UsageError(f"{flag}: {error.why} for the policy loss {choice.loss.policy}") from None


def resolve_list(
    loss: str | None = None, loss_from: str | None = None, **shorthands: float | str | None
) -> list[tuple[str, LossChoice]]:
    """Each loss of `--loss a,b,c` (a what-if: the first is the store's, the others are judged beside it),
    as (the name given, its `LossChoice`); one loss as `resolve` reads it. Every name is resolved, and a
    list that mixes in `--loss-from` or a shorthand, names a loss twice or leaves a name empty refused,
    before any work."""
    if loss is None or "," not in loss or os.path.lexists(loss):
        return [(loss or loss_from or "default", resolve(loss, loss_from, **shorthands))]
    names = [name.strip() for name in loss.split(",")]
    if "" in names:
        raise UsageError(f"--loss {loss!r}: an empty name in the list; give names separated by commas")
    if loss_from is not None or any(v is not None for v in shorthands.values()):
        raise UsageError(
            f"--loss {loss!r}: a list of losses takes no --loss-from, --eps-low, --eps-high, --bound or "
            "--bound-action (which loss would they change?); describe each loss in a TOML file instead"
        )
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise UsageError(f"--loss {loss!r}: {', '.join(twice)} named twice; name each loss once")
    return [(name, resolve(name)) for name in names]
