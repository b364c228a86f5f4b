"""Zoo kinds of the bookkeeping columns: versions and steps (counters, resume), minibatches, the identity of a
token (seq_id, pos, token_id) and what a response carries from one minibatch to the next."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tests.zoo.edits import chosen, col, from_end, log_sigmoid, logit, put, responses, second_epoch
from tests.zoo.kind import Kind

PT = ("proximal_t_logp", "proximal_t_version")


def _versions(t: pa.Table, shift: np.ndarray | int) -> pa.Table:
    """behave_version (and proximal_t_version, which follows it) moved by `shift`."""
    t = put(t, behave_version=col(t, "behave_version") + shift)
    if "proximal_t_version" in t.column_names:
        t = put(t, proximal_t_version=col(t, "proximal_t_version") + shift)
    return t


def _versions_one_ahead(t):
    return _versions(t, 1)


def _step_recorded_ahead(t):
    """The step counter incremented before the step's forwards are recorded: each token one version
    staler than the weights its prox and theta came from."""
    return put(t, step=col(t, "step") + 1)


def _step_per_rollout(t):
    """A step logged per rollout while the weights (and their version) change every other rollout."""
    step = col(t, "step")
    return put(t, step=step.min() + 2 * (step - step.min()))


def _counter_frozen(t):
    """The engine's version counter stops at the run's 4th step (proximal_t left out: no resume)."""
    t = t.drop_columns([c for c in PT if c in t.column_names])
    step = col(t, "step")
    stop = int(step.min()) + 4
    return put(
        t,
        behave_version=np.where(
            step >= stop, np.minimum(col(t, "behave_version"), stop), col(t, "behave_version")
        ),
    )


def _version_reset(t):
    """After a resume at the run's middle step, the weight version restarts from 0 (the steps go on)."""
    t = t.drop_columns([c for c in PT if c in t.column_names])
    step, version = col(t, "step"), col(t, "behave_version")
    resumed = int(np.median(step))
    return put(t, behave_version=np.where(step >= resumed, np.maximum(version - resumed, 0), version))


def _versions_shuffled(t):
    """The stale responses' versions gathered in another order than the responses (a non-tensor field left
    in the batch order when the batch was reordered)."""
    t = t.drop_columns([c for c in PT if c in t.column_names])
    group, starts, _ = responses(t)
    step, version = col(t, "step")[starts], col(t, "behave_version")[starts]
    shuffled = version.copy()
    for s in np.unique(step):
        stale = np.flatnonzero((step == s) & (version < step))
        shuffled[stale] = np.random.default_rng(int(s)).permutation(version[stale])
    return put(t, behave_version=shuffled[group])


def _step_restarts(t):
    """The resumed run counts steps again from the checkpoint's data position (replayed steps)."""
    step = col(t, "step")
    resumed = int(np.median(step))
    return put(t, step=np.where(step >= resumed, step - (resumed - int(step.min())), step))


def _prompt_token(t):
    """The last prompt token left in each sixth response as its pos 0, with AReaL's prompt version -1."""
    group, starts, _ = responses(t)
    first = np.zeros(t.num_rows, dtype=bool)
    first[starts[::6]] = True
    t = t.drop_columns([c for c in PT if c in t.column_names])
    return put(t, behave_version=np.where(first, -1, col(t, "behave_version")))


def _gradient_accumulation_count(t):
    """n_minibatches recorded as the micro-batches of gradient accumulation (twice the updates)."""
    return put(t, n_minibatches=2 * col(t, "n_minibatches"))


def _same_rows_every_rank(t):
    """Every data-parallel rank writes the whole batch (the same sequences on each rank)."""
    both = pa.concat_tables([t, t])
    order = np.lexsort([col(both, c) for c in ("pos", "seq_id", "minibatch", "step")])
    return both.take(pa.array(order))


def _pos_from_prompt(t):
    """Positions counted from the prompt's start (3 prompt tokens) instead of the response's."""
    return put(t, pos=col(t, "pos") + 3)


def _ignore_index_token(t):
    """The label padding value -100 written as the last token's id in 20% of responses."""
    last = chosen(t, 0.2, 9) & (from_end(t) == 0)
    return put(t, token_id=np.where(last, -100, col(t, "token_id")))


def _tokens_from_a_mask(t):
    """The token-id field filled from a mask tensor of the same shape (0/1 on every token)."""
    return put(t, token_id=col(t, "loss_mask").astype(np.int32))


def _tokens_not_regathered(t):
    """The second epoch's minibatches shuffle the responses but not their token ids (rolled by one)."""
    group, starts, lengths = responses(t)
    rows = np.arange(t.num_rows)
    source = starts[group] + (rows - starts[group] + 1) % lengths[group]
    tokens = col(t, "token_id")
    return put(t, token_id=np.where(second_epoch(t), tokens[source], tokens))


def _behave_recomputed_per_epoch(t):
    """The rollout log-probs re-scored before each epoch's minibatches (batch-variant kernels: other bits)."""
    behave = col(t, "behave_logp").astype(float)
    noisy = log_sigmoid(logit(behave) + np.random.default_rng(10).normal(0.0, 0.01, t.num_rows))
    return put(t, behave_logp=np.where(second_epoch(t), noisy, behave))


def _advantage_per_minibatch(t):
    """Advantages whitened within each minibatch of the second epoch (the batch statistics of a minibatch)."""
    a = col(t, "advantage").astype(float)
    key = col(t, "step") * 1000 + col(t, "minibatch")
    _, slot = np.unique(key, return_inverse=True)
    n = np.bincount(slot)
    mean = np.bincount(slot, a) / n
    std = np.sqrt(np.bincount(slot, (a - mean[slot]) ** 2) / n) + 1e-6
    whitened = (a - mean[slot]) / std[slot]
    return put(t, advantage=np.where(second_epoch(t), whitened, a))


KINDS = (
    Kind(
        "weight versions counted from 1 where steps count from 0", "behave_version_after_step",
        "behave_version", citation="radixark/miles#1893 (disk-delta starts at v0, distributed modes at v1)",
        invariant="behave_version <= step: step s trains from weights of version s",
        plant=_versions_one_ahead,
    ),
    Kind(
        "the step recorded one ahead of the weights the forwards ran on", "version_count", "behave_version",
        citation="areal-project/AReaL#201; verl-project/verl#5725",
        invariant="the freshest tokens (staleness 0) drift least from prox: the engine mismatch alone",
        plant=_step_recorded_ahead, bases=("synthetic", "toy"),
        why_not="SmolLM2's engine mismatch (0.035 nats) is larger than one version's drift (0.022): its "
        "staleness 1 cannot look fresh",
    ),
    Kind(
        "the engine's version counter stops advancing", "version_stalled", "behave_version",
        citation="radixark/miles#2470; huggingface/trl#5932",
        invariant="the freshest version of a step's tokens advances with the steps",
        plant=_counter_frozen, bases=("synthetic-long", "smollm2", "toy"),
    ),
    Kind(
        "a step logged per rollout, the weights updated every other rollout", "versions_slower_than_steps",
        "behave_version", citation="THUDM/slime#2279; radixark/miles#2470",
        invariant="the freshest version advances by one a step", plant=_step_per_rollout,
        bases=("synthetic-long", "smollm2", "toy"),
    ),
    Kind(
        "the weight version restarts at 0 after a resume", "staleness_beyond_max", "behave_version",
        citation="radixark/miles#2835; nvidia-cosmos/cosmos-rl#503; areal-project/AReaL#1345",
        invariant="staleness = step - behave_version stays within max_head_offpolicyness",
        plant=_version_reset, max_staleness=8,
    ),
    Kind(
        "versions gathered in another order than the responses", "drift_not_growing", "behave_version",
        citation="verl-project/verl#2185 (non-tensor data left in the original order after the batch was "
        "reordered)",
        invariant="drift from prox grows with staleness", plant=_versions_shuffled, bases=("synthetic-wide",),
        why_not="drift's growth by staleness is a slope over responses: the fixtures hold too few responses "
        "per staleness level to tell it from none (a tenth of theta's movement per version), and SmolLM2's "
        "policy moves under the noise within a step",
    ),
    Kind(
        "the step counter restarts on resume", "behave_version_after_step", "behave_version",
        citation="allenai/open-instruct#1523; verl-project/verl#5725",
        invariant="behave_version <= step", plant=_step_restarts,
    ),
    Kind(
        "a prompt token left in the response (version -1)", "negative_version", "behave_version",
        citation="areal-project/AReaL areal/trainer/ppo/actor.py@cbff54d (prompt positions carry version -1)",
        invariant="every row is a response token: versions >= 0", plant=_prompt_token,
    ),
    Kind(
        "n_minibatches recorded as the micro-batch count", "incomplete_step", "minibatch",
        citation="huggingface/trl#3388; AgileRL/AgileRL#649",
        invariant="every minibatch index 0..n_minibatches-1 of a step is recorded",
        plant=_gradient_accumulation_count,
    ),
    Kind(
        "every data-parallel rank writes the same sequences", "duplicate_row", "pos",
        citation="hpcaitech/ColossalAI#5066; Gen-Verse/dLLM-RL#10",
        invariant="a token (run_id, seq_id, minibatch, pos) is recorded once", plant=_same_rows_every_rank,
    ),
    Kind(
        "positions counted from the prompt's start", "pos_gap", "pos",
        citation="huggingface/trl#1717; lucidrains/PaLM-rlhf-pytorch#31",
        invariant="positions of a response are exactly 0..L-1", plant=_pos_from_prompt,
    ),
    Kind(
        "the labels' ignore index written as a token id", "token_id_negative", "token_id",
        citation="meta-pytorch/torchtune#1741; huggingface/transformers#15867",
        invariant="a token id is a vocabulary index: >= 0", plant=_ignore_index_token,
    ),
    Kind(
        "token ids taken from a mask tensor of the same shape", "token_id_constant", "token_id",
        citation="RLinf/RLinf#318 (attention_mask and response_mask confused); NVIDIA-NeMo/Gym#1557",
        invariant="a response's token ids are its tokens: not one value over the whole response",
        plant=_tokens_from_a_mask, bases=("synthetic", "smollm2", "toy"),
    ),
    Kind(
        "token ids not re-gathered with the shuffled responses", "token_id_differs_across_minibatches",
        "token_id", citation="verl-project/verl#2185",
        invariant="a response carries the same tokens in every minibatch that trains it",
        plant=_tokens_not_regathered, bases=("synthetic", "smollm2", "toy"), epochs=True,
    ),
    Kind(
        "rollout log-probs re-scored at every epoch", "behave_differs_across_minibatches", "behave_logp",
        citation="pytorch/torchtitan#3629 (batch-variant log-probs); verl-project/verl#2185",
        invariant="the engine's log-probs of a response are the same in every minibatch",
        plant=_behave_recomputed_per_epoch, bases=("synthetic", "smollm2", "toy"), epochs=True,
    ),
    Kind(
        "advantages renormalised per minibatch", "advantage_differs_across_minibatches", "advantage",
        citation="openai/baselines#323; hill-a/stable-baselines#697",
        invariant="a response's advantage is the same in every minibatch that trains it",
        plant=_advantage_per_minibatch, bases=("synthetic", "smollm2", "toy"), epochs=True,
    ),
)  # fmt: skip
