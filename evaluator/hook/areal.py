"""AReaL's PPO update, recorded where it runs: `record_ppo_updates(actor, hook)`.

Written against AReaL 1.0.4 (PyPI; commit a0f3dca2 of areal-project/AReaL), `areal/trainer/ppo/actor.py`:
`PPOActor._ppo_update(data)` splits the step's batch into `ppo_n_minibatches` minibatches and calls
`engine.train_batch(mb, loss_fn=partial(grpo_loss_fn, ...))` once per minibatch; the engine calls the loss
function once per micro-batch with the training forward's `logprobs` and the micro-batch (`[N]` packed with
`cu_seqlens` on the FSDP engine, its `attention_mask` a dict or None). No single AReaL scope holds the
step's rewards, the minibatch index and `logprobs`, so the recorder wraps the three on the actor instance:
the step (rewards, a row index per sequence), each `train_batch` call (the minibatch) and its loss function
(one `record` per micro-batch). AReaL's code and its loss are unchanged; it computes nothing new.

What AReaL's config makes of the columns (`PPOActor._compute_advantages`):
- `actor.use_decoupled_loss: true` with `prox_logp_method: recompute` or `metrics`: `prox_logp` is the
  recompute pass, recorded; with `loglinear` there is no recompute and `prox_logp` is left null;
- `use_decoupled_loss: false` (AReaL's default) with `recompute_logprob: false`: `prox_logp` is the rolled
  behaviour log-prob, a copy: warned when the recorder is installed (before any record), left null;
- `use_decoupled_loss: false` with `recompute_logprob: true`: `logprobs` is overwritten with the recompute,
  so the behaviour log-prob is gone: warned when the recorder is installed, nothing recorded.
"""

from __future__ import annotations

import atexit
import functools
import warnings
from typing import Any

import torch

from evaluator.hook.adapters import areal_record_args
from evaluator.hook.recorder import TokenLogHook
from evaluator.hook.trainers import FakeProxWarning, SeqIds

ROW_KEY = "proxaudit_row"
"""Added to the step's batch `[B, T]`: each token's row, which AReaL's splitting and packing carry along."""


def record_ppo_updates(actor: Any, hook: TokenLogHook) -> AReaLRecorder:
    """Record every PPO update of an AReaL actor into `hook`, from the process that runs its engine.

    `actor` is AReaL's train engine (`FSDPPPOActor`, what `PPOTrainer.actor` is with `AREAL_SPMD_MODE=1`)
    or its `PPOActor`. Step = `engine.get_version()` (AReaL's global step: the engine starts step g from
    weights of version g), minibatch = the index of the `train_batch` call within `_ppo_update`. The hook
    is closed when the process exits (nothing in AReaL would close it).
    """
    atexit.register(hook.close)
    return AReaLRecorder(getattr(actor, "actor", actor), hook)


class AReaLRecorder:
    """The wrappers `record_ppo_updates` installs on one `PPOActor` instance."""

    def __init__(self, ppo_actor: Any, hook: TokenLogHook) -> None:
        self.ppo_actor, self.engine, self.hook = ppo_actor, ppo_actor.engine, hook
        self.record_prox, self.record_any = self._judge_config(ppo_actor.config)
        self._seq_ids: SeqIds | None = None  # made at the first update: torch.distributed is up by then
        self._step: dict[str, Any] = {}
        ppo_actor._ppo_update = functools.partial(self._ppo_update, ppo_actor._ppo_update)

    @staticmethod
    def _judge_config(config: Any) -> tuple[bool, bool]:
        """(record prox_logp, record at all) for AReaL's actor config; the copies are warned about once."""
        if config.use_decoupled_loss:
            return True, True
        if config.recompute_logprob:
            warnings.warn(
                "AReaL's actor.use_decoupled_loss is false and actor.recompute_logprob true: "
                "compute_advantages overwrites the behaviour log-probs (logprobs) with the recompute, so "
                "there is no behaviour policy to audit and nothing is recorded. Set "
                "actor.use_decoupled_loss: true (with actor.prox_logp_method: metrics to keep the recompute)",
                FakeProxWarning,
                stacklevel=3,
            )
            return False, False
        warnings.warn(
            "AReaL's actor.use_decoupled_loss is false: its prox_logp is the behaviour log-prob rolled "
            "(compute_advantages), not a recompute, so prox_logp is recorded null. For the ground truth set "
            "actor.use_decoupled_loss: true with actor.prox_logp_method: metrics (or recompute)",
            FakeProxWarning,
            stacklevel=3,
        )
        return False, True

    def _ppo_update(self, original, data: dict[str, Any]) -> None:
        if not self.record_any:
            return original(data)
        mask = data["attention_mask"]  # (B, T) padded: the step's whole batch
        B, T = mask.shape
        rows = torch.arange(B, device=mask.device)
        data[ROW_KEY] = rows[:, None].expand(B, T)  # (B, T) a view: AReaL splits and packs it with the rest
        self._seq_ids = self._seq_ids or SeqIds(self.hook)
        self._step = {
            "step": int(self.engine.get_version()),
            "n_minibatches": int(self.ppo_actor.config.ppo_n_minibatches),
            "seq_id": self._seq_ids.take(B, device=mask.device),  # (B,) stable over the step's minibatches
            "reward": data.get("rewards"),  # (B,) removed by _ppo_update before the split
            "minibatch": -1,
        }
        train_batch = self.engine.train_batch
        self.engine.train_batch = functools.partial(self._train_batch, train_batch)
        try:
            return original(data)
        finally:
            vars(self.engine).pop("train_batch", None)
            data.pop(ROW_KEY, None)

    def _train_batch(self, original, input_, loss_fn, loss_weight_fn):
        self._step["minibatch"] += 1
        loss = functools.partial(self._loss, loss_fn, self._step["minibatch"])
        return original(input_, loss_fn=loss, loss_weight_fn=loss_weight_fn)

    def _loss(self, loss_fn, minibatch: int, logprobs: torch.Tensor, entropy, input_data: dict, **kwargs):
        self.hook.record(**self.record_args(input_data, logprobs, minibatch))
        return loss_fn(logprobs, entropy, input_data, **kwargs)

    def record_args(self, mb: dict[str, Any], theta_logp: torch.Tensor, minibatch: int) -> dict[str, Any]:
        """`TokenLogHook.record` arguments for one micro-batch (packed, or padded: `areal_record_args`),
        with the step's keys, each sequence's stable `seq_id` and its raw task reward."""
        step, row = self._step, mb[ROW_KEY]
        packed = mb.get("cu_seqlens") is not None
        seq_row = row[mb["cu_seqlens"][:-1].long()] if packed else row[:, 0]  # (b,) rows in the step's batch
        args = areal_record_args(mb, theta_logp=theta_logp, record_prox=self.record_prox)
        args |= {
            "step": step["step"],
            "minibatch": minibatch,
            "n_minibatches": step["n_minibatches"],
            "seq_id": step["seq_id"][seq_row],
        }
        if step["reward"] is not None:
            args["reward"] = step["reward"][seq_row]  # (b,)
        return args
