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
- examples of placeholder log-probs (at or below `SENTINEL`, counted over every row in the cells) and of
  negative token ids.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from evaluator.validate.block_sample import BlockSample
from evaluator.validate.segments import COMPARABLE
from evaluator.validate.shapes import EXAMPLES, example_table
from schemas.token_log import LOGP_COLUMNS

SENTINEL = -1000.0
"""A log-prob at or below this is a placeholder, never a model's: logits 1000 apart are beyond any float32
forward (the clean runs' lowest is -20; a collapsed tiny policy's prox -150), while trainers fill missing
log-probs with -9999 (SkyRL) or a masked_fill of -1e4, -1e9 or float32's minimum."""
_COVERED = ("prox_logp", "advantage", "reward")
"""Optional columns that, where a response has them, belong on every one of its trained tokens."""
_FP16_BITS, _BF16_BITS = 13, 16  # float32 mantissa bits a float16 / bfloat16 value leaves zero


def column_tables(s: BlockSample) -> tuple[pa.Table, pa.Table]:
    """(per (run, name): graded, on_fp16, on_bf16, spans, constant, covered, partial; examples)."""
    k = len(s.run_ids)
    parts, rows = [], []
    for column in dict.fromkeys((*LOGP_COLUMNS, *_COVERED)):
        counts = {
            name: np.zeros(k)
            for name in ("graded", "on_fp16", "on_bf16", "spans", "constant", "covered", "partial")
        }
        values = s.x[column]
        if column in LOGP_COLUMNS:
            precision, on_grid = _precision(s, values)
            counts.update(precision)
            rows += [
                (f"grid:{column}", s.resp[i], int(s.x["pos"][i])) for i in np.flatnonzero(on_grid)[:EXAMPLES]
            ]
            spans, constant = _one_value(s, values)
            counts["spans"], counts["constant"] = _per_run(s, s.first(s.run), spans, constant)
            rows += [(f"constant:{column}", i, 0) for i in np.flatnonzero(constant)[:EXAMPLES]]
            placeholder = (s.x["loss_mask"] > 0) & (values <= SENTINEL)
            rows += [
                (f"sentinel:{column}", s.resp[i], int(s.x["pos"][i]))
                for i in np.flatnonzero(placeholder)[:EXAMPLES]
            ]
        if column in _COVERED:
            covered, partial, at = _coverage(s, values)
            counts["covered"], counts["partial"] = _per_run(s, s.first(s.run), covered, partial)
            rows += [(f"partial:{column}", i, int(at[i])) for i in np.flatnonzero(partial)[:EXAMPLES]]
        names = {"run_id": pa.array(s.run_ids, pa.string()), "name": pa.array([column] * k, pa.string())}
        parts.append(pa.table({**names, **{c: v.astype(np.float64) for c, v in counts.items()}}))
    negative = np.flatnonzero(s.x["token_id"] < 0)[:EXAMPLES]
    rows += [("token_negative", s.resp[i], int(s.x["pos"][i])) for i in negative]
    return pa.concat_tables(parts), example_table(s, rows)


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
