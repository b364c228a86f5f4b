"""Zoo kinds of loss_mask, advantage, reward and proximal_t."""

from __future__ import annotations

import numpy as np

from tests.zoo.edits import chosen, col, from_end, log_sigmoid, logit, put, responses
from tests.zoo.kind import Kind


def _mask(t, masked):
    return put(t, loss_mask=col(t, "loss_mask") & ~masked)


def _eos_masked_pad_is_eos(t):
    """Pad id = EOS id, the mask built as token != pad: the EOS of the 60% of responses that end with it
    is masked (the others were cut at the length limit)."""
    return _mask(t, chosen(t, 0.6, 11) & (from_end(t) == 0))


def _eos_masked_when_truncated(t):
    """The EOS appended at truncation masked out of the loss, on the 30% of responses truncated."""
    return _mask(t, chosen(t, 0.3, 12) & (from_end(t) == 0))


def _first_token_masked(t):
    """The mask built for the prompt's last position, not the first answer token's (off by one)."""
    return _mask(t, col(t, "pos") == 0)


def _mask_cut(t):
    """A mask of another length setting: training stops at pos 15."""
    return _mask(t, col(t, "pos") > 15)


def _tool_tokens_trained(t):
    """Tool-output tokens (4 of them at pos 5..8, in 30% of responses) in the loss: the engine generated
    none of them, its log-prob a 0 placeholder."""
    pos = col(t, "pos")
    tool = chosen(t, 0.3, 13) & (pos >= 5) & (pos <= 8)
    return put(t, behave_logp=np.where(tool, 0.0, col(t, "behave_logp")))


def _loss_sign_flipped(t):
    """The loss negated twice: the updates move the policy against the advantage (theta's logit reflected
    about prox's after minibatch 0)."""
    prox, theta = col(t, "prox_logp"), col(t, "theta_logp")
    moved = (col(t, "minibatch") > 0) & ~np.isnan(prox)
    reflected = log_sigmoid(2 * logit(np.nan_to_num(prox, nan=-1.0)) - logit(theta))
    return put(t, theta_logp=np.where(moved, reflected, theta))


def _nan_for_equal_rewards(t):
    """Groups whose rewards are all equal divide by a zero std (no eps): their advantages are NaN."""
    a = col(t, "advantage")
    return put(t, nan_is_null=False, advantage=np.where(np.abs(a) < 1e-4, np.nan, a))


def _rewards_misaligned(t):
    """Each response's advantage taken from another response of the batch (reward data left in the old
    order after the batch was reordered)."""
    group, starts, _ = responses(t)
    shuffled = np.random.default_rng(14).permutation(col(t, "advantage")[starts])
    return put(t, advantage=shuffled[group])


def _reward_not_written(t):
    """The reward field left at its default (0) while the advantages came from the real scores."""
    return put(t, reward=np.zeros(t.num_rows))


def _reward_on_last_token(t):
    last = from_end(t) == 0
    return put(t, reward=np.where(last, col(t, "reward"), 0.0))


def _resume_keeps_old_logprobs(t):
    """The resume prefill's log-probs dropped: the earlier segments keep their generation log-probs."""
    return put(t, proximal_t_logp=col(t, "behave_logp"))


def _resume_refreshes_some(t):
    """A prefix-cached resume recomputes every third token of the earlier segments only."""
    followed = col(t, "proximal_t_version") == col(t, "behave_version") + 1
    kept = followed & (col(t, "pos") % 3 == 0)
    return put(t, proximal_t_logp=np.where(kept, col(t, "behave_logp"), col(t, "proximal_t_logp")))


def _proximal_t_from_trainer(t):
    """The adapter fills the resumed tokens' proximal_t with the trainer's prox_logp."""
    followed = col(t, "proximal_t_version") == col(t, "behave_version") + 1
    prox = col(t, "prox_logp")
    keep = ~followed | np.isnan(prox)
    return put(t, proximal_t_logp=np.where(keep, col(t, "proximal_t_logp"), prox))


KINDS = (
    Kind(
        "EOS masked: pad id equal to the EOS id", "loss_mask_edge", "loss_mask",
        citation="NVIDIA-NeMo/Megatron-Bridge#4660; NVIDIA-NeMo/Automodel#1338",
        invariant="loss_mask trains a response's last token (EOS) as any other", plant=_eos_masked_pad_is_eos,
    ),
    Kind(
        "EOS masked on truncated samples", "loss_mask_edge", "loss_mask",
        citation="meta-pytorch/torchtune#2967",
        invariant="loss_mask trains a response's last token (EOS) as any other",
        plant=_eos_masked_when_truncated,
    ),
    Kind(
        "loss mask off by one at the response's start", "loss_mask_edge", "loss_mask",
        citation="verl-project/verl#3287", invariant="loss_mask trains the first answer token",
        plant=_first_token_masked,
    ),
    Kind(
        "loss mask of another length than the response", "loss_mask_truncated", "loss_mask",
        citation="Agent-RL/ReCall#80; hiyouga/LlamaFactory#9630",
        invariant="loss_mask spans the response to its last trained token, not a fixed length",
        plant=_mask_cut, why_not="the tiny model's responses are 6 tokens: no mask length to cut",
    ),
    Kind(
        "tool-output tokens in the loss (no engine log-prob)", "behave_placeholder", "behave_logp",
        citation="PeterGriffinJin/Search-R1#21; RLinf/RLinf#318",
        invariant="a trained token was generated by the engine: its behave_logp is not a 0 placeholder",
        plant=_tool_tokens_trained,
    ),
    Kind(
        "policy loss negated twice", "advantage_against_movement", "advantage",
        citation="fla-org/flash-linear-attention#1073",
        invariant="between prox and theta the policy moves with the advantage",
        plant=_loss_sign_flipped, bases=("synthetic", "toy"),
        why_not="SmolLM2's policy (lr 1e-5) moves with its advantages at z 1.7, too little to tell against",
    ),
    Kind(
        "NaN advantages from groups of equal rewards (std 0, no eps)", "non_finite_value", "advantage",
        citation="huggingface/trl#5773; Tencent-Hunyuan/UniRL#330", invariant="advantages are finite",
        plant=_nan_for_equal_rewards,
    ),
    Kind(
        "advantages gathered in another order than the responses", "advantage_ignores_reward", "advantage",
        citation="verl-project/verl#2185; NVIDIA-NeMo/RL#3794",
        invariant="an advantage belongs to the reward logged beside it", plant=_rewards_misaligned,
    ),
    Kind(
        "reward field left at its default while the advantages came from the scores", "reward_constant",
        "reward", citation="NVIDIA-NeMo/RL#3794; NovaSky-AI/SkyRL#1870",
        invariant="the reward logged is the one the advantage was computed from: it varies where they do",
        plant=_reward_not_written, bases=("synthetic", "smollm2", "toy"),
    ),
    Kind(
        "token-level reward written in place of the sequence score", "reward_varies", "reward",
        citation="EleutherAI/gpt-neox#1285; verl-project/verl#535",
        invariant="reward is the sequence reward, repeated on each of its tokens",
        plant=_reward_on_last_token,
    ),
    Kind(
        "resumed request keeps the earlier tokens' old log-probs", "proximal_t_not_updated",
        "proximal_t_logp", citation="THUDM/slime#2128; sgl-project/sglang#11673",
        invariant="a resume refreshes the earlier segments' log-probs under the new version",
        plant=_resume_keeps_old_logprobs,
    ),
    Kind(
        "prefix-cached resume refreshes some tokens only", "proximal_t_partial_update", "proximal_t_logp",
        citation="sgl-project/sglang-jax#580; vllm-project/vllm#22197",
        invariant="a resume refreshes every token of the earlier segments", plant=_resume_refreshes_some,
    ),
    Kind(
        "proximal_t filled from the trainer's recompute", "proximal_t_is_prox", "proximal_t_logp",
        citation="THUDM/slime#2128; areal-project/AReaL#1569",
        invariant="proximal_t is the engine's log-prob under the next version, never the trainer's prox bit "
        "for bit",
        plant=_proximal_t_from_trainer,
    ),
)  # fmt: skip
