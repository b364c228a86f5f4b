"""The loss a replay computes its decisions under: the options `replay` takes, and `proxaudit loss`, which
shows what they resolve to (and the presets) without replaying anything."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from evaluator.cli.common import library_errors, say
from evaluator.cli.options import Number
from evaluator.errors import UsageError

if TYPE_CHECKING:
    from evaluator.lossconfig import LossChoice


def loss_ranges():
    """`evaluator.formulas.loss`, whose ranges the flags take, imported when a value is parsed (listing
    the commands imports no numpy)."""
    from evaluator.formulas import loss

    return loss


def loss_options(command: Callable) -> Callable:
    """`--loss`, `--loss-from` and the shorthands, passed on as keyword arguments."""
    options = [
        click.option(
            "--loss",
            help="A preset (`proxaudit loss` lists them) or a TOML file describing the loss [default: "
            "token PPO, clip 0.2, behaviour weight masked above 5]. replay also takes a list, a,b,c: the "
            "store's loss, then the losses judged beside it in a what-if table.",
        ),
        click.option(
            "--loss-from",
            type=click.Path(dir_okay=False),
            help="The trainer's own config (AReaL's YAML actor: section, verl's, NeMo-RL's loss_fn, a TRL "
            "GRPOConfig YAML, prime-rl's TOML [loss]): its loss keys are read, the others listed as ignored.",
        ),
        click.option("--params", "params_file", type=click.Path(dir_okay=False), hidden=True),
        click.option(
            "--eps-low",
            type=Number(lambda: loss_ranges().AT_LEAST_ZERO),  # then the range of the loss's policy
            help="The ratio is clipped below 1 - eps_low, 0 < eps_low < 1 under PPO (each policy loss has "
            "its range; wins over --loss).",
        ),
        click.option(
            "--eps-high",
            type=Number(lambda: loss_ranges().AT_LEAST_ZERO),
            help="... and above 1 + eps_high, eps_high > 0.",
        ),
        click.option(
            "--bound",
            type=Number(lambda: loss_ranges().UPPER),
            help="U > 0: one token-level rule on the behaviour weight, bound U.",
        ),
        click.option(
            "--bound-action",
            type=click.Choice(["mask", "clamp"]),
            help="Above U the token is masked, or its weight clamped to U [default: mask].",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def loss_choices(loss, loss_from, params_file, eps_low, eps_high, bound, bound_action):
    """(name, `LossChoice`) of each loss of `--loss a,b,c` (one: as `loss_choice`)."""
    from evaluator.lossconfig.resolve import resolve_list

    return resolve_list(
        loss if loss is not None else params_file,
        loss_from,
        eps_low=eps_low,
        eps_high=eps_high,
        bound=bound,
        bound_action=bound_action,
    )


def loss_choice(**loss_keys) -> LossChoice:
    """The `LossChoice` of the options: one loss (a list is replay's what-if)."""
    choices = loss_choices(**loss_keys)
    if len(choices) > 1:
        raise UsageError(f"--loss {loss_keys['loss']!r}: a list of losses is replay's what-if; give one loss")
    return choices[0][1]


@click.command("loss")
@loss_options
@library_errors
def loss_command(**loss_keys) -> None:
    """Show the loss that `replay` would compute its decisions under with these options: the policy
    loss, its clip, the behaviour weight and its rules, the config keys read and ignored. With no
    option, the presets too."""
    from evaluator.lossconfig.presets import PRESETS

    say("\n".join(loss_choice(**loss_keys).lines()))
    if not any(v is not None for v in loss_keys.values()):
        say("\npresets (--loss NAME):")
        width = max(map(len, PRESETS))
        say("\n".join(f"  {name:<{width}}  {loss.describe()}" for name, loss in PRESETS.items()))
