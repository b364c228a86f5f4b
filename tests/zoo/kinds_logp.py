"""Zoo kinds of the log-prob columns: behave_logp (the engine's), prox_logp (the recompute), theta_logp (the
training forward)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tests.builders import roll_within_sequences
from tests.zoo.edits import (
    bfloat16,
    chosen,
    col,
    from_end,
    log_sigmoid,
    logit,
    per_response,
    put,
    raw_logprob,
    second_epoch,
)
from tests.zoo.kind import Kind

ENGINE = ("behave_logp", "proximal_t_logp")
"""The engine's log-prob columns: a bug of the engine's log-probs is in both."""


def _engine(t: pa.Table, edit) -> pa.Table:
    """`edit` applied to every engine log-prob column the log has."""
    return put(t, **{c: edit(col(t, c).astype(float)) for c in ENGINE if c in t.column_names})


def _raw_logprobs(t):
    """Sampled at temperature 0.7, logged before the temperature (vLLM's raw_logprobs)."""
    return _engine(t, lambda lp: raw_logprob(lp, 0.7))


def _top_logprob(t):
    """The first entry of the engine's top-logprobs dict (the most likely token's) logged for tokens that
    were not the most likely: a probability of at least 0.6 of the rest."""
    return _engine(t, lambda lp: np.where(lp < np.log(0.5), np.log(0.6 * -np.expm1(lp)), lp))


def _zero_filled(t):
    """Two tokens too few log-probs from the engine, padded with 0.0, on 40% of responses."""
    pad = chosen(t, 0.4, 1) & (from_end(t) < 2)
    return put(t, behave_logp=np.where(pad, 0.0, col(t, "behave_logp")))


def _sentinel(t):
    """Missing log-probs filled with -9999 on the last token of 5% of responses."""
    pad = chosen(t, 0.05, 2) & (from_end(t) == 0)
    return put(t, behave_logp=np.where(pad, -9999.0, col(t, "behave_logp")))


def _behave_is_old(t):
    prox = col(t, "prox_logp")
    return put(t, behave_logp=np.where(np.isnan(prox), col(t, "behave_logp"), prox))


def _behave_partly_old(t):
    """15% of responses (their engine log-probs lost) take the recompute's."""
    prox, pick = col(t, "prox_logp"), chosen(t, 0.15, 3)
    return put(t, behave_logp=np.where(pick & ~np.isnan(prox), prox, col(t, "behave_logp")))


def _behave_bf16(t):
    return _engine(t, bfloat16)


def _behave_rolled(t):
    for c in ENGINE:
        if c in t.column_names:
            t = roll_within_sequences(t, c, 1)
    return t


def _engine_stuck(t):
    """The engine never loads new weights after the first step: its log-probs are those of the first
    step's weights, farther from prox the later the step (a logit walk of 0.05 per step)."""
    step, prox = col(t, "step"), col(t, "prox_logp")
    walk = np.random.default_rng(4).normal(0.0, 1.0, t.num_rows) * 0.05 * (step - step.min())
    stuck = log_sigmoid(logit(np.where(np.isnan(prox), col(t, "behave_logp"), prox)) + walk)
    return put(t, behave_logp=stuck)


def _behave_clamped(t):
    """Log-probs clamped at a floor (-3) to keep -inf out of the loss: every token below it at -3."""
    return _engine(t, lambda lp: np.maximum(lp, -3.0))


def _prox_first_position_padded(t):
    """The trainer's logits shifted for next-token prediction and left-padded with a row of zeros: the
    first response token's log-prob is the uniform one, -log(vocab), in prox and theta alike."""
    first, uniform = col(t, "pos") == 0, -np.log(49152.0)
    prox = col(t, "prox_logp")
    return put(
        t,
        prox_logp=np.where(first & ~np.isnan(prox), uniform, prox),
        theta_logp=np.where(first, uniform, col(t, "theta_logp")),
    )


def _behave_sequence_sum(t):
    return put(t, behave_logp=per_response(t, col(t, "behave_logp").astype(float)))


def _prox_zero(t):
    prox = col(t, "prox_logp")
    return put(t, prox_logp=np.where(np.isnan(prox), np.nan, 0.0))


def _prox_per_minibatch(t):
    """prox recomputed before every minibatch: the current weights (bf16 noise apart), so theta itself."""
    noise = np.random.default_rng(5).normal(0.0, 0.003, t.num_rows)
    prox = col(t, "prox_logp")
    return put(t, prox_logp=np.where(np.isnan(prox), np.nan, np.minimum(col(t, "theta_logp") + noise, 0.0)))


def _prox_per_epoch(t):
    """prox recomputed at the start of the second epoch, after the first epoch's updates."""
    prox = col(t, "prox_logp").astype(float)
    moved = log_sigmoid(logit(prox) + np.random.default_rng(6).normal(0.0, 0.1, t.num_rows))
    return put(t, prox_logp=np.where(second_epoch(t), moved, prox))


def _prox_short(t):
    """The recompute's tensor two tokens shorter than 30% of the responses (packing): null there."""
    cut = chosen(t, 0.3, 7) & (from_end(t) < 2)
    return put(t, prox_logp=np.where(cut, np.nan, col(t, "prox_logp")))


def _prox_rolled(t):
    return roll_within_sequences(t, "prox_logp", -1)


def _prox_dropout(t):
    """prox computed in train mode (dropout on): each token's logit off by noise of 0.3."""
    prox = col(t, "prox_logp").astype(float)
    return put(t, prox_logp=log_sigmoid(logit(prox) + np.random.default_rng(8).normal(0.0, 0.3, t.num_rows)))


def _prox_sequence_sum(t):
    return put(t, prox_logp=per_response(t, col(t, "prox_logp").astype(float)))


def _theta_bf16(t):
    return put(t, theta_logp=bfloat16(col(t, "theta_logp").astype(float)))


def _theta_every_other_minibatch(t):
    """The optimizer steps every second minibatch: theta at minibatches 1 and 3 is still prox's."""
    odd = col(t, "minibatch") % 2 == 1
    return put(t, theta_logp=np.where(odd, col(t, "prox_logp"), col(t, "theta_logp")))


KINDS = (
    Kind(
        "engine log-probs before the sampling temperature (raw_logprobs)", "behave_below_prox", "behave_logp",
        citation="huggingface/trl#4159; PrimeIntellect-ai/prime-rl#697; NVIDIA-NeMo/RL#902; "
        "vllm-project/vime#64",
        invariant="behave_logp is the log-prob of the distribution the token was sampled from: mean "
        "behave - prox = KL(pi_behave || pi_prox) >= 0",
        plant=_raw_logprobs, bases=("synthetic",),
        why_not="a fixture holds one log-prob per token, not the engine's logits: the log-prob at another "
        "temperature needs the whole softmax (the synthetic plant draws one per token)",
    ),
    Kind(
        "the most likely token's log-prob logged for the sampled one", "engine_mismatch", "behave_logp",
        citation="huggingface/trl#3867 (review: `next(iter(lp.values()))` is the top-ranked entry)",
        invariant="behave_logp is the sampled token's: at staleness 0 it differs from prox by the engine "
        "mismatch only",
        plant=_top_logprob,
    ),
    Kind(
        "missing engine log-probs padded with 0.0", "behave_placeholder", "behave_logp",
        citation="vllm-project/vime#70; pytorch/rl#4255",
        invariant="a trained token has the engine's log-prob: never exactly 0 where the trainer finds it "
        "unlikely",
        plant=_zero_filled,
    ),
    Kind(
        "missing log-probs filled with a sentinel (-9999)", "logp_sentinel", "behave_logp",
        citation="vllm-project/vime#70 (SkyRL fills missing logprobs with -9999.0); ROCm/vllm#572",
        invariant="a log-prob is a model's: above -1000", plant=_sentinel,
    ),
    Kind(
        "rollout log-probs missing, the old (recomputed) ones used instead", "behave_is_prox", "behave_logp",
        citation="unslothai/unsloth-zoo#891; NovaSky-AI/SkyRL#1813",
        invariant="behave_logp comes from the engine at generation, never bit-equal to the trainer's on "
        "stale tokens",
        plant=_behave_is_old,
    ),
    Kind(
        "some responses' rollout log-probs lost and filled from the trainer", "behave_mixed_source",
        "behave_logp", citation="google/tunix#2339; THUDM/slime#945",
        invariant="... on no stale token, not only on most", plant=_behave_partly_old,
    ),
    Kind(
        "engine log-probs in bfloat16", "logp_low_precision", "behave_logp",
        citation="genlm/genlm-backend#66; huggingface/transformers#31267",
        invariant="log-probs are computed and kept in float32 (or wider)", plant=_behave_bf16,
    ),
    Kind(
        "rollout log-probs one token off the trainer's", "misaligned_logp", "behave_logp",
        citation="PrimeIntellect-ai/prime-rl#1525; modelscope/ms-swift#8196; lucidrains/PaLM-rlhf-pytorch#31",
        invariant="every log-prob of a row is the log-prob of that row's token", plant=_behave_rolled,
    ),
    Kind(
        "engine weights never synced (versions advance, weights do not)", "drift_follows_step",
        "behave_version",
        citation="huggingface/trl#5312; huggingface/trl#5932; marin-community/marin#1829",
        invariant="the drift |prox - behave| grows with staleness, not with the step at a given staleness",
        plant=_engine_stuck,
    ),
    Kind(
        "log-probs clamped at a floor", "logp_placeholder", "behave_logp",
        citation="dphnAI/sonar#329 (logprobs normalised not to go below -1000); PyAutoLabs/PyAutoFit#1533",
        invariant="a log-prob is the model's, not a fill value shared by unrelated tokens",
        plant=_behave_clamped, bases=("synthetic", "smollm2", "toy"),
    ),
    Kind(
        "trainer logits left-padded at the first position (shifted for next-token prediction)",
        "logp_placeholder", "prox_logp",
        citation="PrimeIntellect-ai/prime-rl#606 (review: `torch.cat([zeros, logits[:, :-1]])`)",
        invariant="a log-prob is the forward's of its own token, not a fill value shared by unrelated tokens",
        plant=_prox_first_position_padded, bases=("synthetic", "smollm2", "toy"),
    ),
    Kind(
        "a sequence's log-prob (its sum) written on every token", "logp_per_sequence", "behave_logp",
        citation="rasbt/reasoning-from-scratch#243; walkinglabs/hands-on-modern-rl#75",
        invariant="each token carries its own log-prob", plant=_behave_sequence_sum,
    ),
    Kind(
        "recompute skipped, prev_logprobs written as zeros", "prox_logp_zero", "prox_logp",
        citation="NVIDIA-NeMo/RL nemo_rl/algorithms/grpo.py@7ea279abfbeb698b092856d0dab61e7cf39bc909 "
        "(force_on_policy_ratio: prev_logprobs = zeros_like); GMISWE/tinker-cloud#32",
        invariant="prox_logp is a recompute: not exactly 0 on nearly every token", plant=_prox_zero,
    ),
    Kind(
        "old log-probs recomputed with the updated weights at every minibatch", "prox_moves_with_theta",
        "prox_logp", citation="thu-ml/tianshou#745; areal-project/AReaL#1457",
        invariant="prox is the weights at the start of the step: it does not follow theta through the "
        "minibatches",
        plant=_prox_per_minibatch, bases=("synthetic", "toy"),
        why_not="SmolLM2's theta moves 0.014 nats from minibatch 0 to 1 (lr 1e-5), under the noise",
    ),
    Kind(
        "old log-probs recomputed at every PPO epoch", "prox_differs_across_minibatches", "prox_logp",
        citation="areal-project/AReaL#201; vwxyzjn/ppo-implementation-details#5",
        invariant="a response's prox is the same in every minibatch of its step",
        plant=_prox_per_epoch, bases=("synthetic", "smollm2", "toy"), epochs=True,
    ),
    Kind(
        "trainer log-probs shorter than the response (packing)", "prox_logp_partial", "prox_logp",
        citation="PrimeIntellect-ai/prime-rl#606",
        invariant="where a response has prox_logp, it has it on every trained token", plant=_prox_short,
    ),
    Kind(
        "trainer log-probs shifted by the label roll", "misaligned_logp", "prox_logp",
        citation="PrimeIntellect-ai/prime-rl#1525 (review: labels shifted left, logprobs[i] = "
        "log P(token i+1))",
        invariant="every log-prob of a row is the log-prob of that row's token", plant=_prox_rolled,
    ),
    Kind(
        "old log-probs computed in train mode (dropout on)", "theta_not_prox_at_minibatch_0", "theta_logp",
        citation="huggingface/trl#4; huggingface/trl#454",
        invariant="theta equals prox at minibatch 0 (the same weights, the same forward)",
        plant=_prox_dropout, bases=("synthetic", "smollm2", "toy"),
    ),
    Kind(
        "trainer log-prob summed over the sequence, broadcast to tokens", "logp_per_sequence", "prox_logp",
        citation="walkinglabs/hands-on-modern-rl#75", invariant="each token carries its own log-prob",
        plant=_prox_sequence_sum,
    ),
    Kind(
        "trainer log-probs from bf16 logits without the fp32 upcast", "logp_low_precision", "theta_logp",
        citation="huggingface/trl#7084 (liger selective_log_softmax on bf16 logits)",
        invariant="log-probs are computed and kept in float32 (or wider)", plant=_theta_bf16,
    ),
    Kind(
        "optimizer step every other minibatch (micro-batches counted as minibatches)", "theta_equals_prox",
        "theta_logp", citation="huggingface/trl#5645; verl-project/verl#2793",
        invariant="after minibatch 0 theta has moved: never prox bit for bit",
        plant=_theta_every_other_minibatch, bases=("synthetic", "smollm2", "toy"),
    ),
)  # fmt: skip
