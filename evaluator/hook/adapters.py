"""Map the batch layouts of two common trainers onto `TokenLogHook.record` keyword arguments.

Each adapter only renames tensors and declares their alignment; the hook does the aligning. Use as
`hook.record(step=..., minibatch=..., n_minibatches=..., **areal_record_args(batch, theta_logp=logprobs))`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def areal_record_args(
    batch: Mapping[str, torch.Tensor], *, theta_logp: torch.Tensor, rolled: bool = True
) -> dict[str, object]:
    """AReaL's actor batch (prompt+response, padded `[B, T]` or packed `[N]` with `cu_seqlens`).

    - `input_ids`, `versions` (-1 on the prompt), `attention_mask`, `proximal_logprobs_t`: token-aligned.
    - `prox_logp` (from `compute_logp`) and `theta_logp` (the loss function's `logprobs`): rolled
      (`next_token`), as `gather_logprobs(logits, torch.roll(input_ids, -1))` makes them.
    - `logprobs` (pi_behave, 0 on the prompt), `loss_mask` and `advantages`: token-aligned as the rollout
      made them; `compute_advantages` rolls `logprobs` and `loss_mask` by -1 and computes `advantages` on
      the rolled mask, so with `rolled=True` (the batch `ppo_update` and `grpo_loss_fn` see) all three are
      `next_token`. Pass `rolled=False` for a batch before `compute_advantages` (it has no `advantages`).
    - `rewards`: one per sequence.
    """
    after = "next_token" if rolled else "token"
    args: dict[str, object] = {
        "token_id": batch["input_ids"],
        "response_mask": batch["loss_mask"],
        "behave_logp": batch["logprobs"],
        "behave_version": batch["versions"],
        "theta_logp": theta_logp,
    }
    optional = {
        "attention_mask": "attention_mask",
        "cu_seqlens": "cu_seqlens",
        "prox_logp": "prox_logp",
        "proximal_t_logp": "proximal_logprobs_t",
        "advantage": "advantages",
        "reward": "rewards",
    }
    args |= {name: batch[key] for name, key in optional.items() if batch.get(key) is not None}
    args["alignment"] = {
        "response_mask": after,
        "behave_logp": after,
        "advantage": after,
        "prox_logp": "next_token",
        "theta_logp": "next_token",
    }
    return args


def verl_record_args(
    batch: Mapping[str, torch.Tensor], *, theta_logp: torch.Tensor, behave_version: int | torch.Tensor
) -> dict[str, object]:
    """verl's actor batch: response-only, padded `[B, R]`, every tensor token-aligned.

    In verl's decoupled setup `rollout_log_probs` (from the inference engine) is pi_behave and
    `old_log_probs` (the actor's recompute) is pi_prox; `theta_logp` is the `log_prob` of the update's
    forward pass. verl keeps no per-token versions, so the caller passes `behave_version`: an int, `[B]`
    (one per response) or `[B, R]`. `reward` is the sequence score (`token_level_scores` summed over the
    response, where verl puts it on the last token).
    """
    if batch.get("rollout_log_probs") is None:
        raise KeyError(
            "verl batch has no rollout_log_probs: the behaviour log-probs are needed "
            "(set actor_rollout_ref.rollout.calculate_log_probs=True)"
        )
    responses = batch["responses"]  # (B, R)
    B, R = responses.shape
    version = torch.as_tensor(behave_version, device=responses.device)
    version = version.expand(B, R) if version.dim() == 0 else version
    version = version[:, None].expand(B, R) if version.dim() == 1 else version  # (B, R)
    args: dict[str, object] = {
        "token_id": responses,
        "response_mask": batch["response_mask"],
        "behave_logp": batch["rollout_log_probs"],
        "behave_version": version,
        "theta_logp": theta_logp,
    }
    if batch.get("old_log_probs") is not None:
        args["prox_logp"] = batch["old_log_probs"]
    if batch.get("advantages") is not None:
        args["advantage"] = batch["advantages"]
    if batch.get("token_level_scores") is not None:
        args["reward"] = batch["token_level_scores"].sum(-1)  # (B,)
    return args
