"""What the findings read of each column's values on a sample of whole blocks of responses
(`evaluator.validate.block_sample`), column by column: the precision its log-probs were computed in, a
log-prob that is one value over a whole response (a sequence's, not a token's), and a column present on
some of a response's trained tokens but not the others. Per (run, column), counts that add up over files
(`evaluator.validate.evidence`), and a few example tokens per kind.

- precision: of the log-probs below `COMPARABLE`, how many sit on the float16 grid (the 13 lowest bits of
  the float32 zero) and on the bfloat16 grid (16 bits): a float32 value has them zero once in 8,192 (or
  65,536) draws, a value computed or stored in 16 bits always;
- per-token values: responses with 3+ log-probs, all below `COMPARABLE`, and how many carry one value on
  every token;
- coverage: responses with the column on some trained token, and how many lack it on others;
- per run (`token_table`): behave bit-equal to prox or theta on stale tokens, prox or theta exactly 0
  where behave is not, negative token ids;
- examples of those and of placeholder log-probs (below `SENTINEL`, which the cells count over every
  row).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from evaluator.validate.block_sample import BlockSample
from evaluator.validate.segments import COMPARABLE
from evaluator.validate.shapes import EXAMPLES, example_table
from schemas.token_log import LOGP_COLUMNS

SENTINEL = -1000.0
"""A log-prob below this is a placeholder, never a model's: logits 1000 apart are beyond any float32
forward (the clean runs' lowest is -20; a collapsed tiny policy's prox -150), while trainers fill missing
log-probs with -9999 (SkyRL) or a masked_fill of -1e4, -1e9 or float32's minimum."""
PLACEHOLDER_THETA = -0.1
"""A trained token whose behave_logp is exactly 0 (probability 1) while the trainer gives it under 0.9
has no engine log-prob: a placeholder (0 on none of the clean runs' tokens)."""
_COVERED = ("prox_logp", "advantage", "reward")
"""Optional columns that, where a response has them, belong on every one of its trained tokens."""
_FP16_BITS, _BF16_BITS = 13, 16  # float32 mantissa bits a float16 / bfloat16 value leaves zero


_COUNTS = (
    "graded", "on_fp16", "on_bf16", "spans", "constant", "mode_n", "mode_gap", "pair_n", "pair_gap",
    "covered", "partial",
)  # fmt: skip
PARTNER = {"behave_logp": "theta_logp", "prox_logp": "behave_logp", "theta_logp": "behave_logp",
            "proximal_t_logp": "theta_logp"}  # fmt: skip
"""The log-prob a column's repeated value is compared with: another forward's, on the same token."""


def column_tables(s: BlockSample) -> tuple[pa.Table, pa.Table]:
    """(per (run, name): the counts of `_COUNTS`; examples)."""
    k = len(s.run_ids)
    parts, rows = [], []
    for column in dict.fromkeys((*LOGP_COLUMNS, *_COVERED)):
        counts = {name: np.zeros(k) for name in _COUNTS}
        if column in LOGP_COLUMNS:
            rows += _logp_counts(s, column, counts)
        if column in _COVERED:
            covered, partial, at = _coverage(s, s.x[column])
            counts["covered"], counts["partial"] = _per_run(s, s.first(s.run), covered, partial)
            rows += [(f"partial:{column}", i, int(at[i])) for i in np.flatnonzero(partial)[:EXAMPLES]]
        names = {"run_id": pa.array(s.run_ids, pa.string()), "name": pa.array([column] * k, pa.string())}
        parts.append(pa.table({**names, **{c: v.astype(np.float64) for c, v in counts.items()}}))
    return pa.concat_tables(parts), example_table(s, rows + _token_examples(s))


def token_table(s: BlockSample) -> pa.Table:
    """Per run, over the sample's trained tokens: those with prox_logp, and prox (theta) exactly 0 where
    behave_logp is below PLACEHOLDER_THETA (theta: and prox, where it has one); the stale ones below
    COMPARABLE (with prox), and how many have behave bit-equal to prox or theta; over every row, the token
    ids and the negative ones; the responses of 4+ tokens with token ids, and those carrying one id on
    every token."""
    x, loss = s.x, s.x["loss_mask"] > 0
    behave, prox, theta = x["behave_logp"], x["prox_logp"], x["theta_logp"]
    unlikely = loss & (behave < PLACEHOLDER_THETA)
    graded = loss & (x["step"] > x["behave_version"]) & (behave < COMPARABLE)
    flags = {
        "n_loss": loss,
        "n_prox": loss & np.isfinite(prox),
        "prox_zero": unlikely & (prox == 0),
        "theta_zero": unlikely & (theta == 0) & ~(prox >= PLACEHOLDER_THETA),
        "n_cmp": graded,
        "n_cmp_prox": graded & np.isfinite(prox),
        "behave_is_prox_cmp": graded & (behave == prox),
        "behave_is_theta_cmp": graded & (behave == theta),
        "n_token": np.isfinite(x["token_id"]),
        "token_negative": x["token_id"] < 0,
    }
    spans, constant = _one_token(s)
    sums = _per_run(s, s.run, *flags.values()) + _per_run(s, s.first(s.run), spans, constant)
    flags |= {"token_spans": spans, "token_constant": constant}
    columns = {name: total.astype(np.float64) for name, total in zip(flags, sums, strict=True)}
    return pa.table({"run_id": pa.array(s.run_ids, pa.string()), **columns})


def _one_token(s: BlockSample) -> tuple[np.ndarray, np.ndarray]:
    """Per response: a token id on each of its 4+ tokens; of those, one id on every token."""
    tokens = s.x["token_id"]
    present = np.isfinite(tokens)
    spans = (s.total(present) == s.lengths) & (s.lengths >= 4)
    return spans, spans & (s.lowest(tokens, present) == s.highest(tokens, present))


def _token_examples(s: BlockSample) -> list[tuple[str, int, int]]:
    """Example tokens of `token_table`'s signals: a negative token id; behave bit-equal to prox or theta on
    a stale token below COMPARABLE; prox or theta exactly 0 where behave is below PLACEHOLDER_THETA."""
    x, loss = s.x, s.x["loss_mask"] > 0
    behave, stale = x["behave_logp"], x["step"] > x["behave_version"]
    at = {"token_negative": x["token_id"] < 0}
    first = np.zeros(len(x["pos"]), dtype=bool)
    first[s.starts] = True
    at["token_constant"] = first & s.spread(_one_token(s)[1])
    for column in ("prox_logp", "theta_logp"):
        at[f"equal:{column}"] = loss & stale & (behave < COMPARABLE) & (behave == x[column])
        at[f"zero:{column}"] = loss & (behave < PLACEHOLDER_THETA) & (x[column] == 0)
    return [
        (kind, s.resp[i], int(x["pos"][i])) for kind, w in at.items() for i in np.flatnonzero(w)[:EXAMPLES]
    ]


def _logp_counts(s: BlockSample, column: str, counts: dict[str, np.ndarray]) -> list[tuple[str, int, int]]:
    """Fill `counts` with a log-prob column's precision, per-token and repeated-value counts; its
    example rows (kind, response, pos)."""
    values = s.x[column]
    precision, on_grid = _precision(s, values)
    counts.update(precision)
    spans, constant = _one_value(s, values)
    counts["spans"], counts["constant"] = _per_run(s, s.first(s.run), spans, constant)
    at_mode, repeated = _repeated_value(s, values, s.x[PARTNER[column]])
    counts.update(repeated)
    placeholder = (s.x["loss_mask"] > 0) & (values < SENTINEL)
    at = {f"grid:{column}": on_grid, f"sentinel:{column}": placeholder, f"mode:{column}": at_mode}
    rows = [
        (kind, s.resp[i], int(s.x["pos"][i])) for kind, w in at.items() for i in np.flatnonzero(w)[:EXAMPLES]
    ]
    return rows + [(f"constant:{column}", i, 0) for i in np.flatnonzero(constant)[:EXAMPLES]]


def _repeated_value(s: BlockSample, values: np.ndarray, partner: np.ndarray):
    """(rows at each run's most frequent log-prob below COMPARABLE; per run: how many rows hold it
    (`mode_n`) and the sum of |partner - value| over them (`mode_gap`), against every graded row with a
    partner (`pair_n`, `pair_gap`)). Another forward's log-prob of the same token sits near a model's
    value (within the drift), but anywhere against a fill value given to unrelated tokens."""
    k = len(s.run_ids)
    graded = np.isfinite(values) & (values < COMPARABLE)
    mode = np.full(k, np.nan)
    for run in np.unique(s.run[graded]):  # a file holds one run, or a few
        found, count = np.unique(values[graded & (s.run == run)], return_counts=True)
        mode[run] = found[np.argmax(count)]
    at_mode = graded & (values == mode[s.run])
    paired = graded & np.isfinite(partner)
    gap = np.where(paired, np.abs(partner - values), 0.0)
    mode_n, mode_gap, pair_n, pair_gap = _per_run(s, s.run, at_mode, np.where(at_mode & paired, gap, 0.0),
                                                  paired, gap)  # fmt: skip
    return at_mode, {"mode_n": mode_n, "mode_gap": mode_gap, "pair_n": pair_n, "pair_gap": pair_gap}


def _per_run(s: BlockSample, run: np.ndarray, *flags: np.ndarray) -> list[np.ndarray]:
    return [np.bincount(run, f.astype(np.float64), minlength=len(s.run_ids)) for f in flags]


def _precision(s: BlockSample, values: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(per run, the log-probs below COMPARABLE and how many of them have float16 / bfloat16 precision;
    the rows on the float16 grid)."""
    graded = np.isfinite(values) & (values < COMPARABLE)
    bits = np.where(graded, values, -1.0).astype(np.float32).view(np.uint32)  # exact: float32 read as float64
    on_fp16 = graded & (bits & ((1 << _FP16_BITS) - 1) == 0)
    on_bf16 = graded & (bits & ((1 << _BF16_BITS) - 1) == 0)
    graded_n, fp16_n, bf16_n = _per_run(s, s.run, graded, on_fp16, on_bf16)
    return {"graded": graded_n, "on_fp16": fp16_n, "on_bf16": bf16_n}, on_fp16


def _one_value(s: BlockSample, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per response: 3+ log-probs, all below COMPARABLE (no near-certain token rounding alike); and of
    those, one value on every token."""
    present = np.isfinite(values)
    n = s.total(present)
    low, high = s.lowest(values, present), s.highest(values, present)
    spans = (n >= 3) & (high < COMPARABLE)
    return spans, spans & (low == high)


def _coverage(s: BlockSample, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per response: the column on some trained token; of those, lacking on others; the first such pos."""
    trained = s.x["loss_mask"] > 0
    have = s.total(trained & np.isfinite(values))
    lack = trained & ~np.isfinite(values)
    return have > 0, (have > 0) & (s.total(lack) > 0), np.where(have > 0, s.lowest(s.x["pos"], lack), 0)
