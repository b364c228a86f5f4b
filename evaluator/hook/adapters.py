"""AReaL's and verl's batches as `TokenLogHook.record` keyword arguments: names and alignments only, the hook
does the aligning. `evaluator.hook.areal` and `evaluator.hook.verl` call these inside the trainers; they can
also be used by hand, as `hook.record(step=..., minibatch=..., n_minibatches=..., **areal_record_args(...))`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

AREAL_NEXT_TOKEN = {
    n: "next_token" for n in ("response_mask", "behave_logp", "prox_logp", "theta_logp", "advantage")
}
"""After `compute_advantages` (AReaL 1.0.4, `areal/trainer/ppo/actor.py`), `loss_mask`, `logprobs`
(pi_behave), `prox_logp` (the recompute) and `advantages` are rolled by one, as is the loss function's
`logprobs` (a gather at `torch.roll(input_ids, -1)`): value i belongs to token i + 1. `input_ids` and
`versions` are not rolled."""


def areal_record_args(
    batch: Mapping[str, object], *, theta_logp: torch.Tensor, record_prox: bool = True
) -> dict[str, object]:
    """AReaL's actor batch after `compute_advantages` (what `ppo_update` and the loss function see):
    prompt+response, packed `[N]` with `cu_seqlens` (the FSDP engine's micro-batches, whose
    `attention_mask` is a dict or None) or padded `[B, T]` with a tensor `attention_mask`.

    `theta_logp` is the loss function's `logprobs`. `prox_logp` is recorded where the batch has it and
    `record_prox` (False where AReaL's config makes it a copy of pi_behave: `evaluator.hook.areal`).
    """
    args: dict[str, object] = {
        "token_id": batch["input_ids"],
        "response_mask": batch["loss_mask"],
        "behave_logp": batch["logprobs"],
        "behave_version": batch["versions"],
        "theta_logp": theta_logp,
        "alignment": AREAL_NEXT_TOKEN,
    }
    if batch.get("cu_seqlens") is not None:
        args["cu_seqlens"] = batch["cu_seqlens"]
    elif isinstance(batch.get("attention_mask"), torch.Tensor):
        args["attention_mask"] = batch["attention_mask"]
    if batch.get("advantages") is not None:
        args["advantage"] = batch["advantages"]
    if record_prox and batch.get("prox_logp") is not None:
        args["prox_logp"] = batch["prox_logp"]
    return args


def verl_record_args(
    batch: Mapping[str, torch.Tensor],
    *,
    theta_logp: torch.Tensor,
    behave_version: int | torch.Tensor,
    record_prox: bool = True,
) -> dict[str, object]:
    """verl's actor batch, response-only and padded `[B, R]` (a V1 mini-batch after `to_padded_tensor()`,
    as `ppo_loss` makes it), every tensor token-aligned.

    `rollout_log_probs` (the inference engine's) is pi_behave and `old_log_probs` (the actor's recompute)
    pi_prox unless `record_prox` is False (bypass mode copies `rollout_log_probs` into it). Rows are the
    response tokens: V1's `loss_mask` (the agent loop's response mask) where the batch has it, else
    `response_mask`. `loss_mask` is `response_mask`, which rollout rejection sampling
    (`compute_rollout_correction_and_add_to_batch`) overwrites: rejected tokens are kept, out of the loss.
    `behave_version` is an int, `[B]` or `[B, R]`; `reward` is `rm_scores` (or `token_level_scores`) summed
    over the response.
    """
    if batch.get("rollout_log_probs") is None:
        raise KeyError(
            "verl batch has no rollout_log_probs: the behaviour log-probs are needed "
            "(set actor_rollout_ref.rollout.calculate_log_probs=True)"
        )
    responses = batch["responses"]  # (B, R)
    B, R = responses.shape
    version = torch.as_tensor(behave_version)  # on the host for an int: no copy to the device
    version = version.expand(B, R) if version.dim() == 0 else version
    version = version[:, None].expand(B, R) if version.dim() == 1 else version  # (B, R)
    rows = batch.get("loss_mask")
    args: dict[str, object] = {
        "token_id": responses,
        "response_mask": batch["response_mask"] if rows is None else rows,
        "loss_mask": batch["response_mask"],
        "behave_logp": batch["rollout_log_probs"],
        "behave_version": version,
        "theta_logp": theta_logp,
    }
    if record_prox and batch.get("old_log_probs") is not None:
        args["prox_logp"] = batch["old_log_probs"]
    if batch.get("advantages") is not None:
        args["advantage"] = batch["advantages"]
    scores = next((batch[k] for k in ("rm_scores", "token_level_scores") if batch.get(k) is not None), None)
    if scores is not None:
        args["reward"] = scores.sum(-1)  # (B,) verl puts the score on the last response token
    return args
