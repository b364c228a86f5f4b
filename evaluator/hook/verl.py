"""verl's V1 trainer, recorded where it runs: `record_actor_updates(trainer, out_dir, run_id)`.

Written against verl 0.9.1 (PyPI wheel; `verl/trainer/ppo/v1/trainer_base.py`, `verl/workers/utils/losses.py`,
`verl/workers/engine_workers.py`). The actor's update runs in Ray workers: `update_actor` fetches every
field of the step's samples from TransferQueue, splits them into mini-batches (`train_mini_batch`), the
engine splits those into micro-batches and calls the loss function, `partial(ppo_loss, config=...)`, once
per micro-batch with the training forward's `log_probs`. The only way in from the driver is the workers'
`set_loss_fn`, so the recorder is a loss function: `RecordingLoss` wraps verl's own `ppo_loss` and records
each micro-batch before computing it. The driver side adds, to each update's `extra_info` (which verl hands
to the workers as non-tensor data), the step and the update's first minibatch index.

Step: the trainer's weights at the start of `global_steps` g are version g - 1 (`on_step_end` publishes
them as `update_weights(global_steps)`, and the agent loop stamps each trajectory with the
`global_steps` of the weights that generated it: `extra_fields.min_global_steps` / `max_global_steps`). So
the recorded step is g - 1 and `behave_version` is `max_global_steps`, verl's own staleness convention
(`trajectory_staleness = global_steps - 1 - max_global_steps`); a trajectory resumed across versions has
older tokens than that. One step holds `parameter_sync_step` local updates of
`ppo_epochs * train_batch_size / parameter_sync_step / ppo_mini_batch_size` minibatches each.
"""

from __future__ import annotations

import atexit
import itertools
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import torch

from evaluator.hook.adapters import verl_record_args
from evaluator.hook.recorder import TokenLogHook
from evaluator.hook.trainers import FakeProxWarning, SeqIds, rank_and_world

KEYS = ("proxaudit_step", "proxaudit_minibatch", "proxaudit_n_minibatches", "proxaudit_update")
FIELDS = (
    "responses",
    "loss_mask",
    "response_mask",
    "rollout_log_probs",
    "old_log_probs",
    "advantages",
    "rm_scores",
)
BYPASS = (
    "verl's algorithm.rollout_correction.bypass_mode is true: old_log_probs is a copy of rollout_log_probs "
    "(trainer_base._compute_old_log_prob), so prox_logp is recorded null. For the ground truth run the "
    "decoupled mode (bypass_mode: false, the default), which recomputes old_log_probs every step"
)


def record_actor_updates(
    trainer: Any, out_dir: str | Path, run_id: str, **hook_options: Any
) -> RecordingLoss:
    """Record every actor update of a verl V1 trainer (after `trainer.init()`, before `fit`).

    Sends a `RecordingLoss` around `ppo_loss` (with the actor config the workers build,
    `omega_conf_to_dataclass(config.actor_rollout_ref.actor)`) to the actor workers, each of which writes
    `out_dir/rank{r}/`, and stamps every `_update_actor` call with its step and minibatch index.
    """
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.utils.losses import ppo_loss

    config = trainer.config
    if config.get("distillation") and config.distillation.get("enabled"):
        raise ValueError(
            "the verl recorder wraps ppo_loss; distillation (distillation.enabled) is not supported"
        )
    if not config.actor_rollout_ref.rollout.get("calculate_log_probs"):
        raise ValueError(
            "set actor_rollout_ref.rollout.calculate_log_probs=True: the behaviour log-probs are needed"
        )
    correction = config.algorithm.get("rollout_correction") or {}
    prox = not correction.get("bypass_mode", False)
    if not prox:
        warnings.warn(BYPASS, FakeProxWarning, stacklevel=2)
    actor = config.actor_rollout_ref.actor
    loss = RecordingLoss(
        partial(ppo_loss, config=omega_conf_to_dataclass(actor)), out_dir, run_id, prox, hook_options
    )
    trainer.actor_rollout_wg.set_loss_fn(loss)
    per_update = actor.ppo_epochs * (config.data.train_batch_size // trainer.parameter_sync_step)
    per_update //= actor.ppo_mini_batch_size
    updates = itertools.count()
    update_actor = trainer._update_actor

    def stamped_update_actor(batch, metrics):
        batch.extra_info |= step_info(trainer, per_update, next(updates))
        return update_actor(batch, metrics=metrics)

    trainer._update_actor = stamped_update_actor
    return loss


def step_info(trainer: Any, per_update: int, update: int) -> dict[str, int]:
    """What one `_update_actor` call tells the workers: the step (weights version at its start), the first
    minibatch index of this local update, the step's minibatch count, and a number of its own."""
    return dict(
        proxaudit_step=trainer.global_steps - 1,
        proxaudit_minibatch=trainer.local_trigger_step * per_update,
        proxaudit_n_minibatches=trainer.parameter_sync_step * per_update,
        proxaudit_update=update,
    )


class RecordingLoss:
    """A verl loss function (`(model_output, data, dp_group)`) that records, then returns `loss_fn`'s result.

    Pickled to the workers; each opens its own `TokenLogHook` on its first call. A micro-batch's minibatch
    is the update's first one plus the sequences this worker has seen in the update divided by its share
    of a mini-batch (`global_batch_size / dp_size`): micro-batches partition a mini-batch in order.
    """

    def __init__(
        self, loss_fn, out_dir: str | Path, run_id: str, record_prox: bool, hook_options: dict
    ) -> None:
        self.loss_fn, self.out_dir, self.run_id = loss_fn, Path(out_dir), run_id
        self.record_prox, self.hook_options = record_prox, hook_options
        self.hook: TokenLogHook | None = None
        self._update, self._seen, self._seq_ids = None, 0, None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "hook": None}  # a hook (its thread, its files) belongs to one process

    def __call__(self, model_output: dict, data, dp_group=None):
        self.hook = self.hook or self._open_hook()
        self.hook.record(**self.record_args(model_output, data))
        return self.loss_fn(model_output=model_output, data=data, dp_group=dp_group)

    def _open_hook(self) -> TokenLogHook:
        if not self.record_prox:
            warnings.warn(BYPASS, FakeProxWarning, stacklevel=3)
        hook = TokenLogHook(self.out_dir / f"rank{rank_and_world()[0]}", self.run_id, **self.hook_options)
        self._seq_ids = SeqIds(hook)
        atexit.register(hook.close)  # nothing else closes it when the worker process ends
        return hook

    def record_args(self, model_output: dict, data) -> dict[str, Any]:
        from verl.workers.utils.padding import no_padding_2_padding

        keys = set(data.keys())  # a TensorDict has no `in`
        if missing := [k for k in (*KEYS, "extra_fields") if k not in keys]:
            raise KeyError(
                f"verl micro-batch has no {missing}: install with record_actor_updates(trainer, ...)"
            )
        info = {k: data[k] for k in KEYS}  # non-tensor data: Python ints, no device sync
        if info["proxaudit_update"] != self._update:
            self._update, self._seen = info["proxaudit_update"], 0
        b = len(data)
        minibatch = info["proxaudit_minibatch"] + self._seen // (data["global_batch_size"] // data["dp_size"])
        self._seen += b
        fields = data.select(*(k for k in FIELDS if k in keys)).to_padded_tensor()  # (b, R) each
        R = fields["responses"].shape[1]
        theta = no_padding_2_padding(model_output["log_probs"], data)[:, :R]  # (b, R) as ppo_loss makes it
        version = [
            e.get("max_global_steps") for e in data.get("extra_fields").tolist()
        ]  # the agent loop's stamps
        if None in version:
            raise KeyError(
                "verl samples lack extra_fields.max_global_steps (the generating weights' version)"
            )
        args = verl_record_args(
            fields, theta_logp=theta, behave_version=torch.tensor(version), record_prox=self.record_prox
        )
        return args | {
            "step": info["proxaudit_step"],
            "minibatch": minibatch,
            "n_minibatches": info["proxaudit_n_minibatches"],
            "seq_id": self._seq_ids.take(b),  # (b,) unique over the ranks
        }
