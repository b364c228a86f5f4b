"""A response recorded again in a later minibatch of its step (PPO epochs), on a sample of whole blocks of
responses (`evaluator.validate.block_sample`): what it must carry unchanged. Its tokens, the engine's
log-probs, its advantage and its reward are data of the response, the same in every minibatch that
trains it; prox is the weights at the start of the step, the same too. Only theta moves.

Per run: the repeated responses, and how many carry another value than at their first minibatch, per
column (token by token; prox by its mean, within `SAME_PROX`), plus a few example tokens per kind.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from evaluator.validate.block_sample import BlockSample
from evaluator.validate.shapes import EXAMPLES, Responses, example_table

SAME_PROX = 1e-3
"""Mean |prox_logp difference| (nats) under which a response's prox is the same in two minibatches."""
_KEPT = ("token_id", "behave_logp", "advantage", "reward")
"""Columns a repeated response carries bit for bit (null where it was null)."""


def _first_of(s: BlockSample, r: Responses) -> tuple[np.ndarray, np.ndarray]:
    """(response repeats an earlier minibatch's response of its step, that first response's index)."""
    key = np.stack([s.first(s.x[c]) for c in ("step", "seq_id")] + [r.run.astype(np.float64)])
    again = np.zeros(len(r.run), dtype=bool)
    again[1:] = (key[:, 1:] == key[:, :-1]).all(axis=0)
    return again, np.maximum.accumulate(np.where(~again, np.arange(len(again)), 0))


def _changed(s: BlockSample, again: np.ndarray, first: np.ndarray) -> dict[str, np.ndarray]:
    """Per column of _KEPT, per response: a repeat whose value differs from its first response's on some
    token (a repeat of another length differs in every column)."""
    same_length = again & (s.lengths == s.lengths[first])
    rows = np.flatnonzero(s.spread(same_length))
    resp = s.resp[rows]
    mirror = s.starts[first[resp]] + rows - s.starts[resp]  # the same position in the first response
    out = {}
    for column in _KEPT:
        x = s.x[column]
        a, b = x[rows], x[mirror]
        differs = np.zeros(len(s.resp), dtype=bool)
        differs[rows] = ~((a == b) | (np.isnan(a) & np.isnan(b)))
        out[column] = (again & ~same_length) | (s.total(differs) > 0)
    return out


def repeat_tables(s: BlockSample, r: Responses) -> tuple[pa.Table, pa.Table]:
    """(per run: repeated responses (with prox: `repeated`; all: `compared`), those with another prox
    (`differs`) and those with another value per column of _KEPT (`{column}_differs`); examples)."""
    again, first = _first_of(s, r)
    with np.errstate(invalid="ignore"):
        prox_differs = again & (np.abs(r.prox - r.prox[first]) > SAME_PROX)
    changed = _changed(s, again, first)
    flags = {
        "repeated": again & np.isfinite(r.prox),
        "differs": prox_differs,
        "compared": again,
        **{f"{column}_differs": changed[column] for column in _KEPT},
    }
    k = len(s.run_ids)
    table = pa.table(
        {
            "run_id": pa.array(s.run_ids, pa.string()),
            **{n: np.bincount(r.run, f, minlength=k).astype(np.float64) for n, f in flags.items()},
        }
    )
    kinds = {"prox_repeat_differs": prox_differs, **{f"repeat:{c}": changed[c] for c in _KEPT}}
    rows = [(kind, i, 0) for kind, where in kinds.items() for i in np.flatnonzero(where)[:EXAMPLES]]
    return table, example_table(s, rows)
