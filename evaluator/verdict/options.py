"""The methods a trainer can run as its proximal log-prob, each with the setting that selects it: a verdict
recommends only these (the `*_exact` methods, `loglinear` and `linear` are measures, no trainer's option),
and `reuse_train_logp` only on a run of one minibatch per step (AReaL forces one: the training forward's
log-prob equals prox only at minibatch 0)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainerOption:
    """A method a trainer runs, with the trainer and its config setting (read at a pinned commit)."""

    method: str
    trainer: str
    setting: str
    one_minibatch: bool = False
    """the trainer runs it with one minibatch per step only"""

    def __str__(self) -> str:
        return f"{self.trainer} {self.setting}"


OPTIONS: tuple[TrainerOption, ...] = (
    # AReaL cbff54d, areal/api/cli_args.py PPOActorConfig.prox_logp_method (areal/utils/constants.py
    # ProxLogpMethod); `loglinear` pairs each token with the previous token's version (loglinear_shipped).
    TrainerOption("loglinear_shipped", "AReaL", "actor.prox_logp_method: loglinear"),
    # ... `reuse_train_logp` requires ppo_n_minibatches=1 (PPOActorConfig.__post_init__ forces it).
    TrainerOption(
        "reuse_train_logp", "AReaL", "actor.prox_logp_method: reuse_train_logp", one_minibatch=True
    ),
    # verl b178a3cd, verl/trainer/config/algorithm.py RolloutCorrectionConfig.bypass_mode: the rollout's
    # log-prob as the old log-prob (behave as prox).
    TrainerOption("rollout", "verl", "algorithm.rollout_correction.bypass_mode: true"),
)
RECOMPUTE = "AReaL actor.prox_logp_method: recompute"
"""The trainer's recompute pass (the ground truth), what "keep the recompute" means."""


def option_of(method: str | None) -> TrainerOption | None:
    return next((o for o in OPTIONS if o.method == method), None)


def options_for(minibatches: int | None) -> tuple[TrainerOption, ...]:
    """The options a run of `minibatches` minibatches per step can use (None: unknown, so not
    `reuse_train_logp`)."""
    return tuple(o for o in OPTIONS if not o.one_minibatch or minibatches == 1)
