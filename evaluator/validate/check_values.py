"""Checks of each column's values alone: a log-prob is a model's (not a placeholder such as -9999), of one
token (not one value over a whole response), computed in float32 or wider (not rounded to 16 bits); an
optional column a response has is on all of its trained tokens; a token id is not negative."""

from __future__ import annotations

import polars as pl

from evaluator.problems import Finding
from evaluator.validate.columns import PARTNER, SENTINEL
from evaluator.validate.evidence import PLACEHOLDER_THETA, RunEvidence
from evaluator.validate.verdicts import MIN_RESPONSES, MIN_TOKENS, Undecided, Verdict, too_few
from schemas.token_log import LOGP_COLUMNS

REPEATED = 0.02
"""One log-prob value below -0.01 held by 2%+ of a column's tokens (the clean runs' most frequent value:
at most 0.55%, a context repeated in a group) ..."""
FAR = 1.5
"""... on tokens 1.5x as far from another forward's log-prob of them (theta's, or behave's) as the
column's tokens are on average: a fill value lands anywhere, while a value repeated because its context
repeats (a collapsed policy's) sits within the drift of the other forward's."""
TRAINER_ZEROS = 0.01
"""Trained tokens whose prox_logp (or theta_logp) is exactly 0 while the engine's log-prob, and prox's
for theta, is below -0.1: none on the clean runs; 1% is a placeholder (a pad or a first position the
shifted logits do not cover), not a forward's log-prob."""
LOW_PRECISION = 0.9
"""Log-probs below -0.01 on the float16 grid (the 13 lowest bits of the float32 zero): a float32 value lands
there once in 8,192 (the clean runs: 0.7% to 1.1%, values of few significant bits); 90% or more were
computed or stored in 16 bits."""
ONE_VALUE = 0.5
"""Responses of 3+ log-probs below -0.01 carrying one value on every token: never on the clean runs (each
token its own log-prob); half or more is a sequence's value broadcast to its tokens."""
PARTIAL = 0.01
"""Responses with an optional column on some trained tokens and not on others: none on the clean runs;
1% (and 3 at least) is a tensor shorter than the response."""
_PARTIAL_RULE = {
    "prox_logp": "prox_logp_partial",
    "advantage": "advantage_partial",
    "reward": "reward_partial",
}


def _columns(e: RunEvidence, *kinds: str) -> pl.DataFrame:
    """Per column (in LOGP_COLUMNS' order, then the others), the sums of `kinds` over the files."""
    order = {c: i for i, c in enumerate(LOGP_COLUMNS)}
    by = e.columns.group_by("name").agg(pl.col(*kinds).sum())
    return by.sort(pl.col("name").replace_strict(order, default=len(order)), "name")


def sentinel(e: RunEvidence, _) -> Verdict:
    """logp_sentinel: trained tokens whose log-prob is a placeholder (below SENTINEL)."""
    n = int(e.cells["n"].sum())
    if n == 0:
        return Undecided("no loss token")
    counts = {c: int(e.cells[f"sentinel_{c}"].sum()) for c in LOGP_COLUMNS}
    column = max(counts, key=counts.get)
    if counts[column] == 0:
        return None
    where = pl.col(f"sentinel_{column}") > 0
    return Finding(
        "logp_sentinel", e.run_id, column, counts[column],
        f"{counts[column]:,} of {n:,} trained tokens have {column} below {SENTINEL:g}: no model gives "
        "such a log-prob (probability under e^-1000); it is a placeholder for a missing value, and every "
        "ratio and error on those tokens is meaningless",
        float(counts[column]), f"> 0 tokens < {SENTINEL:g}",
        e.example(f"sentinel:{column}") or e.cell_examples(where),
        f"where {column} is filled for tokens without a log-prob (SkyRL fills -9999, a masked_fill of -1e4 "
        "or float32's minimum): such tokens belong out of the loss (loss_mask false), or need their real "
        "log-prob",
    )  # fmt: skip


def placeholder(e: RunEvidence, _) -> Verdict:
    """logp_placeholder: prox_logp or theta_logp exactly 0 where the other log-probs find the token
    unlikely; or one log-prob value on many unrelated tokens (a fill value)."""
    if undecided := too_few(e.tokens["n_loss"].sum(), "loss tokens"):
        return undecided
    for column, count, base in (("prox_logp", "prox_zero", "n_prox"), ("theta_logp", "theta_zero", "n_loss")):
        zero, of = int(e.tokens[count].sum()), int(e.tokens[base].sum())
        if of and zero >= TRAINER_ZEROS * of:
            what = f"exactly 0 (probability 1) while behave_logp is below {PLACEHOLDER_THETA}"
            return _placeholder(e, column, zero, of, what, e.example(f"zero:{column}"))
    by = _columns(e, "graded", "mode_n", "mode_gap", "pair_n", "pair_gap").filter(
        pl.col("graded") >= MIN_TOKENS
    )
    far = (pl.col("mode_gap") / pl.col("mode_n")) >= FAR * pl.col("pair_gap") / pl.col("pair_n")
    one = by.filter((pl.col("mode_n") >= REPEATED * pl.col("graded")) & (pl.col("pair_n") > 0) & far)
    if one.is_empty():
        return None
    row = one.row(0, named=True)
    column, at, of = row["name"], int(row["mode_n"]), int(row["graded"])
    gap, usual = row["mode_gap"] / at, row["pair_gap"] / row["pair_n"]
    what = (
        f"one and the same value, {gap:.3g} nats on average from their {PARTNER[column]} (against "
        f"{usual:.3g} on the other tokens)"
    )
    return _placeholder(e, column, at, of, what, e.example(f"mode:{column}"))


def _placeholder(e: RunEvidence, column: str, at: int, of: int, what: str, examples: tuple) -> Finding:
    return Finding(
        "logp_placeholder", e.run_id, column, at,
        f"{at:,} of {of:,} tokens have {column} {what}: a placeholder, not a forward's log-prob of the token",
        at / of, f">= {TRAINER_ZEROS:.0%} of the tokens (one value: >= {REPEATED:.0%}, {FAR:g}x as far)",
        examples,
        f"how {column} is filled and laid out against the tokens: a pad or fill value at positions the "
        "shifted logits do not cover (the first or last), a clamp, or tokens no forward scored",
    )  # fmt: skip


def precision(e: RunEvidence, _) -> Verdict:
    """logp_low_precision: a log-prob column rounded to float16 or bfloat16."""
    by = _columns(e, "graded", "on_fp16", "on_bf16").filter(pl.col("graded") >= MIN_TOKENS)
    if by.is_empty():
        return Undecided(f"fewer than {MIN_TOKENS} log-probs below -0.01 in every log-prob column")
    low = by.filter(pl.col("on_fp16") >= LOW_PRECISION * pl.col("graded"))
    if low.is_empty():
        return None
    row = low.row(0, named=True)  # the first in LOGP_COLUMNS' order: behave's before proximal_t's
    column, n, fp16, bf16 = row["name"], int(row["graded"]), int(row["on_fp16"]), int(row["on_bf16"])
    kind, bits = ("bfloat16", 8) if bf16 >= LOW_PRECISION * n else ("float16", 11)
    return Finding(
        "logp_low_precision", e.run_id, column, fp16,
        f"{fp16:,} of {n:,} values of {column} below -0.01 sit on the float16 grid and {bf16:,} on the "
        f"bfloat16 grid (a float32 value does once in 8,192 and 65,536): the column was computed or stored "
        f"in {kind} ({bits} significant bits), whose rounding alone moves a log-prob near -5 by up to "
        f"{2.0 ** (2 - bits):.3g} nats",
        fp16 / n, f">= {LOW_PRECISION:.0%} of the values", e.example(f"grid:{column}"),
        f"the dtype {column} is computed and kept in: log_softmax on float32 logits (upcast before the "
        "softmax, not after), and no bf16/fp16 tensor on the way to the log",
    )  # fmt: skip


def per_token(e: RunEvidence, _) -> Verdict:
    """logp_per_sequence: a log-prob column holding one value over each whole response."""
    by = _columns(e, "spans", "constant").filter(pl.col("spans") >= MIN_RESPONSES)
    if by.is_empty():
        return Undecided(f"fewer than {MIN_RESPONSES} responses of 3+ log-probs below -0.01")
    one = by.filter(pl.col("constant") >= ONE_VALUE * pl.col("spans"))
    if one.is_empty():
        return None
    row = one.sort("constant", descending=True).row(0, named=True)
    column, spans, constant = row["name"], int(row["spans"]), int(row["constant"])
    return Finding(
        "logp_per_sequence", e.run_id, column, constant,
        f"{constant:,} of {spans:,} responses carry one and the same {column} on every token: a sequence's "
        "value (its sum, mean or sequence-level ratio) broadcast to its tokens, not each token's log-prob",
        constant / spans, f">= {ONE_VALUE:.0%} of the responses", e.example(f"constant:{column}"),
        f"that {column} is the per-token log-prob gathered at each token (not a sequence total, mean or "
        "GSPO's sequence ratio expanded over the response)",
    )  # fmt: skip


def coverage(e: RunEvidence, _) -> Verdict:
    """prox_logp_partial, advantage_partial, reward_partial: the column on some trained tokens of a
    response and not on others."""
    by = _columns(e, "covered", "partial").filter(pl.col("name").is_in(list(_PARTIAL_RULE)))
    present = by.filter(pl.col("covered") > 0)
    if present.is_empty():
        return Undecided("no prox_logp, advantage or reward on a trained token")
    if undecided := too_few(
        present["covered"].max(), "responses with prox_logp, advantage or reward", MIN_RESPONSES
    ):
        return undecided
    bad = present.filter((pl.col("partial") >= 3) & (pl.col("partial") >= PARTIAL * pl.col("covered")))
    if bad.is_empty():
        return None
    row = bad.sort("partial", descending=True).row(0, named=True)
    column, covered, partial = row["name"], int(row["covered"]), int(row["partial"])
    return Finding(
        _PARTIAL_RULE[column], e.run_id, column, partial,
        f"{partial:,} of {covered:,} responses with {column} on some trained tokens lack it on others: the "
        "tensor it came from is shorter than the response (or offset), so the values present may sit on "
        "the wrong tokens",
        partial / covered, f">= {PARTIAL:.0%} of the responses (3+)", e.example(f"partial:{column}"),
        f"the length and offset of the {column} tensor against the response's tokens (packing, padding, a "
        "first or last token dropped)",
    )  # fmt: skip


def token_ids(e: RunEvidence, _) -> Verdict:
    """token_id_negative: a token id below 0 (padding or an ignore index such as -100); token_id_constant:
    one token id over whole responses."""
    rows = int(e.tokens["n_token"].sum())
    if rows == 0:
        return Undecided("no token_id column")
    negative = int(e.tokens["token_negative"].sum())
    spans, constant = (float(e.tokens[c].sum()) for c in ("token_spans", "token_constant"))
    if negative == 0 and spans >= MIN_RESPONSES and constant >= ONE_VALUE * spans:
        return Finding(
            "token_id_constant", e.run_id, "token_id", int(constant),
            f"{int(constant):,} of {int(spans):,} responses of 4+ tokens carry one and the same token_id on "
            "every token: not the response's tokens but another tensor (a mask, a pad id, a sequence's id)",
            constant / spans, f">= {ONE_VALUE:.0%} of the responses", e.example("token_constant"),
            "which tensor the hook records as token_id: the response's own token ids",
        )  # fmt: skip
    if negative == 0:
        return None
    return Finding(
        "token_id_negative", e.run_id, "token_id", negative,
        f"{negative:,} of {rows:,} rows have a negative token_id: no vocabulary has one; a padding id or an "
        "ignore index (-100) of the labels was written as a response token",
        float(negative), "> 0 rows", e.example("token_negative"),
        "which rows the hook records: the response's own tokens, not padding or label positions set to the "
        "ignore index",
    )  # fmt: skip
