"""Small edits the zoo's generators share: columns as numpy, responses, log-prob arithmetic."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tests.builders import sequence_index, set_column


def col(t: pa.Table, name: str) -> np.ndarray:
    return t[name].to_numpy(zero_copy_only=False)


def put(t: pa.Table, nan_is_null: bool = True, **columns: np.ndarray) -> pa.Table:
    """`t` with the named columns replaced (NaN becomes null unless `nan_is_null` is False)."""
    for name, values in columns.items():
        array = pa.array(values, from_pandas=nan_is_null).cast(t.schema.field(name).type)
        t = set_column(t, name, array)
    return t


def responses(t: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(response number per row, first row per response, length per response)."""
    return sequence_index(t)


def chosen(t: pa.Table, share: float, seed: int = 0) -> np.ndarray:
    """Rows of a random `share` of the responses (whole responses), deterministic."""
    group, starts, _ = responses(t)
    return (np.random.default_rng(seed).random(len(starts)) < share)[group]


def from_end(t: pa.Table) -> np.ndarray:
    """Per row, its position counted from the end of its response (0 on the last token)."""
    group, starts, lengths = responses(t)
    return starts[group] + lengths[group] - 1 - np.arange(t.num_rows)


def logit(logp: np.ndarray) -> np.ndarray:
    """The log-odds of a token of log-prob `logp` against every other token."""
    return logp - np.log(-np.expm1(np.minimum(logp, -1e-7)))


def log_sigmoid(x: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -x)


def bfloat16(x: np.ndarray) -> np.ndarray:
    """`x` rounded to bfloat16 (round to nearest even), as float32; NaN stays NaN."""
    bits = np.nan_to_num(x).astype(np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) & np.uint32(0xFFFF0000)
    return np.where(np.isnan(x), np.nan, rounded.view(np.float32))


def per_response(t: pa.Table, values: np.ndarray, how=np.add) -> np.ndarray:
    """`how.reduceat` of `values` over each response, spread back on its rows."""
    group, starts, _ = responses(t)
    return how.reduceat(values, starts)[group]


def ppo_epochs(t: pa.Table) -> pa.Table:
    """Two PPO epochs: every response recorded again in a later minibatch of its step, with the same
    data (tokens, behave, advantage, reward, prox) and a theta that moved on."""
    m = int(col(t, "n_minibatches").max())
    again = put(t, minibatch=col(t, "minibatch") + m)
    again = put(again, theta_logp=log_sigmoid(logit(col(t, "theta_logp")) + 0.05))
    both = pa.concat_tables([t, again])
    return put(both, n_minibatches=np.full(both.num_rows, 2 * m))


def second_epoch(t: pa.Table) -> np.ndarray:
    """Rows of the later epoch of a `ppo_epochs` log."""
    return col(t, "minibatch") >= col(t, "n_minibatches") // 2


def raw_logprob(logp: np.ndarray, temperature: float, seed: int = 0, vocab: int = 32) -> np.ndarray:
    """The log-prob at temperature 1 of tokens sampled at `temperature` with log-prob `logp`: each token's
    context a softmax over `vocab` tokens whose other logits are drawn N(0, 2), the sampled token's logit
    set so that its probability at `temperature` is exp(logp)."""
    rng = np.random.default_rng(seed)
    others = rng.normal(0.0, 2.0, (len(logp), vocab - 1))  # (N, V-1)
    lse_t = np.logaddexp.reduce(others / temperature, axis=1)  # (N,)
    lse_1 = np.logaddexp.reduce(others, axis=1)  # (N,)
    lp = np.minimum(np.nan_to_num(logp, nan=-1.0), -1e-7)
    z = temperature * (lp - np.log(-np.expm1(lp)) + lse_t)  # the sampled token's logit
    return np.where(np.isnan(logp), np.nan, z - np.logaddexp(z, lse_1))
