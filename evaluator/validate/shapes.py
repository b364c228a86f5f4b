"""What the findings read from the shape of each response of a sample of whole blocks of responses
(`evaluator.validate.block_sample`): the loss mask within a response, the advantage and reward over its
tokens, and how the policy moved on it between prox and theta (a response recorded in several
minibatches: `evaluator.validate.repeats`). Each is reduced to small per-run tables of counts and sums,
which pool over the files of a call by adding them up (`evaluator.validate.evidence`), plus a few example
tokens per kind (`examples`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from evaluator.validate.audit_sample import SHIFTS, shifted
from evaluator.validate.block_sample import BlockSample

HIST_CAP = 4096
"""Positions and lengths above this share one histogram bin."""
EXAMPLES = 3
"""Example tokens kept per kind and file."""


@dataclass
class Responses:
    """Per response of the sample (R,): its run code and what the findings read."""

    run: np.ndarray
    length: np.ndarray
    n_loss: np.ndarray
    lead: np.ndarray  # masked positions before the first trained one (-1: no trained token)
    tail: np.ndarray  # masked positions after the last trained one (-1: no trained token)
    last_loss: np.ndarray
    a_mean: np.ndarray  # mean advantage over the trained tokens (NaN: none)
    a_resp: np.ndarray  # the response's advantage: a_mean, or over all its tokens where none is trained
    a_varies: np.ndarray
    a_edge_only: np.ndarray  # varies, but only at its first or last trained token
    r: np.ndarray
    r_varies: np.ndarray
    move: np.ndarray  # mean theta - prox over trained tokens at minibatch > 0 (NaN: none)
    move_masked: np.ndarray  # ... over masked tokens
    prox: np.ndarray  # mean prox_logp (NaN: none)
    switches: np.ndarray  # loss_mask changes along pos


def responses(s: BlockSample) -> Responses:
    """Every response's figures, vectorised over the sample's rows."""
    x, loss = s.x, s.x["loss_mask"] > 0
    pos = x["pos"]
    first, last = s.lowest(pos, loss), s.highest(pos, loss)
    trained = np.isfinite(first)
    length = s.lengths.astype(np.float64)
    adv = x["advantage"]
    with_a = loss & np.isfinite(adv)
    a_min, a_max = s.lowest(adv, with_a), s.highest(adv, with_a)
    inner = with_a & (pos != s.spread(first)) & (pos != s.spread(last))
    inner_min, inner_max = s.lowest(adv, inner), s.highest(adv, inner)
    varies = np.isfinite(a_min) & (a_max > a_min)
    a_mean = _mean(s, adv, with_a)
    reward = x["reward"]
    r_min, r_max = s.lowest(reward, np.isfinite(reward)), s.highest(reward, np.isfinite(reward))
    step_d = x["theta_logp"] - x["prox_logp"]
    moved = np.isfinite(step_d) & (x["minibatch"] > 0)
    change = np.zeros(len(loss))
    change[1:] = (loss[1:] != loss[:-1]) & s.next_in_response()[:-1]
    return Responses(
        run=s.first(s.run),
        length=length,
        n_loss=s.total(loss),
        lead=np.where(trained, first, -1),
        tail=np.where(trained, length - 1 - last, -1),
        last_loss=np.where(trained, last, -1),
        a_mean=a_mean,
        a_resp=np.where(np.isfinite(a_mean), a_mean, _mean(s, adv, np.isfinite(adv))),
        a_varies=varies,
        a_edge_only=varies & (s.total(with_a) >= 3) & ~(inner_max > inner_min),
        r=np.where(np.isfinite(r_min), r_min, np.nan),
        r_varies=np.isfinite(r_min) & (r_max > r_min),
        move=_mean(s, step_d, moved & loss),
        move_masked=_mean(s, step_d, moved & ~loss),
        prox=_mean(s, x["prox_logp"], np.isfinite(x["prox_logp"])),
        switches=s.total(change),
    )


def _mean(s: BlockSample, values: np.ndarray, where: np.ndarray) -> np.ndarray:
    n = s.total(where)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, s.total(np.where(where, values, 0.0)) / n, np.nan)


def _per_run(s: BlockSample, run: np.ndarray, **values: np.ndarray) -> pa.Table:
    """One row per run of the sample: each value summed over the responses (or rows) of `run`."""
    k = len(s.run_ids)
    sums = {name: np.bincount(run, v.astype(np.float64), minlength=k) for name, v in values.items()}
    return pa.table({"run_id": s.run_ids, **sums})


def mask_shape(s: BlockSample, r: Responses) -> tuple[pa.Table, pa.Table]:
    """(per run: rows, masked rows, the trained responses' leading/trailing masked tokens and how many
    switches their masks make; histograms by (run, kind, value) of `lead`, `tail`, `length` and
    `last_cut`: the last trained position of responses whose last 2+ tokens are masked)."""
    masked = s.x["loss_mask"] == 0
    trained = r.lead >= 0
    mixed = trained & (r.n_loss < r.length)
    shape = _per_run(
        s,
        r.run,
        responses=trained,
        rows=np.where(trained, r.length, 0),
        masked=np.where(trained, r.length - r.n_loss, 0),
        lead=np.where(trained, r.lead, 0),
        tail=np.where(trained, r.tail, 0),
        mixed=mixed,
        switches=np.where(mixed, r.switches, 0),
        gaps=np.where(mixed, r.length - 1, 0),
    )
    shape = shape.append_column("all_masked", pa.array(np.bincount(s.run, masked, minlength=len(s.run_ids))))
    kinds = {
        "lead": (r.lead, trained),
        "tail": (r.tail, trained),
        "length": (r.length, trained),
        "last_cut": (r.last_loss, trained & (r.tail >= 2)),
    }
    parts = []
    for kind, (value, where) in kinds.items():
        key, count = np.unique(
            np.stack([r.run[where], np.minimum(value[where], HIST_CAP).astype(np.int64)]),
            axis=1,
            return_counts=True,
        )
        parts.append(
            pa.table(
                {
                    "run_id": pa.array([s.run_ids[i] for i in key[0]], pa.string()),
                    "kind": pa.array([kind] * len(count), pa.string()),
                    "value": pa.array(key[1].astype(np.int64)),
                    "n": pa.array(count.astype(np.int64)),
                }
            )
        )
    return shape, pa.concat_tables(parts)


def advantage_shape(s: BlockSample, r: Responses) -> pa.Table:
    """Per run: responses with 2+ trained tokens carrying an advantage, of which it varies, of which only
    at an edge (of those with 3+); responses with a reward, of which it varies."""
    with_a = np.isfinite(r.a_mean) & (r.n_loss >= 2)
    return _per_run(
        s,
        r.run,
        a_responses=with_a,
        a_varies=with_a & r.a_varies,
        a_edge_only=with_a & r.a_edge_only,
        a_long=with_a & r.a_varies & (r.n_loss >= 3),
        r_responses=np.isfinite(r.r),
        r_varies=r.r_varies,
    )


def movement(s: BlockSample, r: Responses) -> pa.Table:
    """Per (run, kind, sign): the responses at minibatch > 0 whose advantage has that sign, and the sum
    and sum of squares of their mean movement theta - prox over trained (`trained`) or masked
    (`masked`) tokens: Welch's test of the movement of positive against negative advantages."""
    parts = []
    for kind, move in (("trained", r.move), ("masked", r.move_masked)):
        for sign in (1, -1):
            chosen = np.isfinite(move) & (np.sign(r.a_resp) == sign)
            m = np.where(chosen, move, 0.0)
            t = _per_run(s, r.run, n=chosen, sum=m, sum_sq=m * m)
            parts.append(
                t.append_column("kind", pa.array([kind] * t.num_rows, pa.string())).append_column(
                    "sign", pa.array([sign] * t.num_rows, pa.int64())
                )
            )
    return pa.concat_tables(parts)


def roll(s: BlockSample, r: Responses) -> pa.Table:
    """Per (run, shift): where the advantage varies within a response, sums for the correlation of its
    local detail at pos i+shift, A - (left + right) / 2, with that of the movement theta - prox at pos i
    (trained tokens at minibatch > 0): the alignment test of the log-probs, on the advantage."""
    x = s.x
    nxt = s.next_in_response()
    ok = (x["loss_mask"] > 0) & s.spread(r.a_varies) & (x["minibatch"] > 0)
    a = np.where(ok & np.isfinite(x["advantage"]), x["advantage"], np.nan)
    d = np.where(ok, x["theta_logp"] - x["prox_logp"], np.nan)
    detail_a, detail_d = _detail(a, nxt), _detail(d, nxt)
    parts = []
    for shift in SHIFTS:
        xa = shifted(detail_a, nxt, shift)
        both = np.isfinite(xa) & np.isfinite(detail_d)
        xa, yd = np.where(both, xa, 0.0), np.where(both, detail_d, 0.0)
        t = _per_run(s, s.run, n=both, sxy=xa * yd, sxx=xa * xa, syy=yd * yd)
        parts.append(t.append_column("shift", pa.array([shift] * t.num_rows, pa.int64())))
    return pa.concat_tables(parts)


def _detail(values: np.ndarray, nxt: np.ndarray) -> np.ndarray:
    """values - (left + right) / 2: what a smooth trend along pos leaves (NaN at a response's ends)."""
    return values - (shifted(values, nxt, -1) + shifted(values, nxt, 1)) / 2


def examples(s: BlockSample, r: Responses) -> pa.Table:
    """A few (run, step, seq_id, minibatch, pos) per kind of signal, for the findings' evidence."""
    trained = r.lead >= 0
    mixed = trained & (r.n_loss < r.length)
    chosen = {
        "advantage_varies": (r.a_varies & ~r.a_edge_only, np.maximum(r.lead, 0)),
        "advantage_edge": (r.a_edge_only, np.maximum(r.lead, 0)),
        "reward_varies": (r.r_varies, np.zeros(len(r.run))),
        "mask_lead": (trained & (r.lead > 0), np.zeros(len(r.run))),
        "mask_tail": (trained & (r.tail > 0), r.length - 1),
        "mask_cut": (trained & (r.tail >= 2), r.last_loss),
        "mask_switches": (mixed & (r.switches >= (r.length - 1) / 2), np.zeros(len(r.run))),
        "against_advantage": (np.sign(r.a_resp) * r.move < 0, np.maximum(r.lead, 0)),
        "masked_moves": (np.sign(r.a_resp) * r.move_masked > 0, np.zeros(len(r.run))),
    }
    rows = [
        (kind, i, int(at[i]))
        for kind, (where, at) in chosen.items()
        for i in np.flatnonzero(where)[:EXAMPLES]
    ]
    return example_table(s, rows)


def example_table(s: BlockSample, rows: list[tuple[str, int, int]]) -> pa.Table:
    """(kind, response, pos) rows as the examples table."""
    first = s.starts[[i for _, i, _ in rows]] if rows else np.zeros(0, dtype=np.int64)
    return pa.table(
        {
            "run_id": pa.array([s.run_ids[s.run[f]] for f in first], pa.string()),
            "kind": pa.array([k for k, _, _ in rows], pa.string()),
            "step": pa.array(s.x["step"][first].astype(np.int64)),
            "seq_id": pa.array(s.x["seq_id"][first].astype(np.int64)),
            "minibatch": pa.array(s.x["minibatch"][first].astype(np.int64)),
            "pos": pa.array([p for _, _, p in rows], pa.int64()),
        }
    )
