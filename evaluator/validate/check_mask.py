"""Checks of loss_mask: its shape within a response (where the first and last trained tokens sit, spans
rather than a scatter) and what masked and trained tokens do between prox and theta (the loss moves the
trained ones with their advantage; the masked ones only follow)."""

from __future__ import annotations

import polars as pl

from evaluator.problems import Finding
from evaluator.validate.evidence import RunEvidence
from evaluator.validate.verdicts import MIN_RESPONSES, Undecided, Verdict, movement_z, too_few

EDGE_MASKED = 0.25
"""One edge of the responses (their first or last tokens) masked in 25%+ of them (the clean runs: 0% to
2.5%; an EOS masked only where it ends the response, as a pad id equal to the EOS id or a truncation that
masks it does, leaves out the responses cut at the length limit) ..."""
EDGE_OVER_OTHER = 5.0
"""... 5 times as often as the other tokens are masked ..."""
OTHER_MASKED = 0.2
"""... while at most 20% of the other tokens are ..."""
SAME_EDGE = 0.8
"""... and 80%+ of those responses mask the same number of edge tokens: the fingerprint of a rolled or
offset loss mask, or of one special token masked (a masked tool output or turn ends elsewhere, at many
lengths)."""
TRUNCATED = 0.5
"""Trained tokens stop at one and the same position K, 2+ tokens before the end, in half or more of the
responses longer than K + 2: a mask cut at a fixed length (clean: the last trained token is the
response's last, or spread over positions)."""
FRAGMENTED = 0.6
"""Mask changes per pair of neighbours in the responses that mix trained and masked tokens: a random
choice of masked tokens changes at most every other pair (0.5, at half masked; clean runs 0.04 to 0.25,
the higher on 8-token responses); beyond 0.6 the mask alternates, a stride or interleave error."""
MASKED_MOVES = 4.0
"""Welch's z of the movement theta - prox of the masked tokens of positive- against negative-advantage
responses (clean: -1.1 to 0.4): at 4 or more the masked tokens move with the advantage, as only trained
tokens should ..."""
MORE_THAN_TRAINED = 3.0
"""... and that movement beats the trained tokens' by a z of 3 or more."""


def _hist(e: RunEvidence, kind: str) -> pl.DataFrame:
    return e.mask_hist.filter(pl.col("kind") == kind).group_by("value").agg(pl.col("n").sum()).sort("value")


def trained(e: RunEvidence, _) -> Verdict:
    """loss_mask_empty: no token of the run is in the loss."""
    rows = int(e.cells["n"].sum() + e.cells["n_masked"].sum())
    if undecided := too_few(rows, "rows"):
        return undecided
    if e.cells["n"].sum() > 0:
        return None
    return Finding(
        "loss_mask_empty", e.run_id, "loss_mask", rows,
        f"none of the run's {rows:,} rows has loss_mask true: nothing was trained, and nothing can be "
        "measured",
        0.0, "no row with loss_mask true", e.cell_examples(pl.col("n_masked") > 0),
        "that loss_mask is true on the response tokens the loss trains (not inverted, not the padding's)",
    )  # fmt: skip


def edges(e: RunEvidence, _) -> Verdict:
    """loss_mask_edge: the first (or last) tokens of many responses masked, as many tokens in each."""
    m = e.mask
    responses = float(m["responses"].sum())
    if undecided := too_few(responses, "responses with a trained token"):
        return undecided
    lead, tail = float(m["lead"].sum()), float(m["tail"].sum())
    inner_rows = float(m["rows"].sum()) - lead - tail
    others = (float(m["masked"].sum()) - lead - tail) / max(1.0, inner_rows)
    for edge, kind, where in (("first", "lead", "the first answer token"), ("last", "tail", "EOS")):
        hist = _hist(e, kind).filter(pl.col("value") >= 1).sort("n", descending=True)
        masked = float(hist["n"].sum())
        share = masked / responses
        if share < max(EDGE_MASKED, EDGE_OVER_OTHER * others) or others > OTHER_MASKED:
            continue
        if hist["n"][0] < SAME_EDGE * masked:
            continue
        k = int(hist["value"][0])
        tokens, verb = ("token", "has") if k == 1 else (f"{k} tokens", "have")
        return Finding(
            "loss_mask_edge", e.run_id, "loss_mask", int(masked),
            f"the {edge} {tokens} of {share:.0%} of {int(responses):,} responses {verb} "
            f"loss_mask false, against {others:.1%} of the other tokens: the fingerprint of a loss mask "
            f"rolled or offset (the {edge} token, often {where}, never learned)",
            share, f">= {EDGE_MASKED:.0%} of responses and {EDGE_OVER_OTHER:g}x the others' rate (<= "
            f"{OTHER_MASKED:.0%}), {SAME_EDGE:.0%}+ at one length",
            e.example(f"mask_{kind}"),
            "the roll of loss_mask against the log-probs, and where the response starts in the mask",
        )  # fmt: skip
    return None


def truncated(e: RunEvidence, _) -> Verdict:
    """loss_mask_truncated: trained tokens stop at one fixed position in responses that go on."""
    cut = _hist(e, "last_cut")
    if cut.is_empty():
        return None
    top = cut.sort("n", descending=True).row(0, named=True)
    k, n = int(top["value"]), float(top["n"])
    longer = float(_hist(e, "length").filter(pl.col("value") > k + 2)["n"].sum())
    if undecided := too_few(longer, f"responses longer than {k + 2} tokens", MIN_RESPONSES):
        return undecided
    if n < TRUNCATED * longer:
        return None
    return Finding(
        "loss_mask_truncated", e.run_id, "loss_mask", int(n),
        f"in {int(n):,} of {int(longer):,} responses longer than {k + 2} tokens the last trained token sits "
        f"at pos {k} and the rest is masked: the loss mask is cut at a fixed length",
        n / longer, f">= {TRUNCATED:.0%} of the longer responses", e.example("mask_cut"),
        "the mask's length against the response's: a max length from another setting, or a mask sliced to "
        "the prompt's length",
    )  # fmt: skip


def fragmented(e: RunEvidence, _) -> Verdict:
    """loss_mask_fragmented: the mask alternates within responses."""
    m = e.mask
    mixed, switches, gaps = (float(m[c].sum()) for c in ("mixed", "switches", "gaps"))
    if mixed == 0:
        return Undecided("no response mixes trained and masked tokens")
    if undecided := too_few(mixed, "responses mixing trained and masked tokens", MIN_RESPONSES):
        return undecided
    rate = switches / max(gaps, 1.0)
    if rate < FRAGMENTED:
        return None
    return Finding(
        "loss_mask_fragmented", e.run_id, "loss_mask", int(mixed),
        f"in the {int(mixed):,} responses that mix trained and masked tokens, loss_mask changes between "
        f"{rate:.0%} of neighbouring tokens: more than any random choice of tokens would (at most 50%)",
        rate, f">= {FRAGMENTED:.0%} of neighbour pairs", e.example("mask_switches"),
        "how the mask is laid out against the tokens: a stride, an interleave of two sequences, or a mask "
        "of another tensor's shape",
    )  # fmt: skip


def movement(e: RunEvidence, _) -> Verdict:
    """loss_mask_movement: masked tokens move with the advantage, more than trained ones."""
    if e.advantage["a_responses"].sum() == 0:
        return Undecided("no advantage column")
    if e.mask["all_masked"].sum() == 0:
        return Undecided("no masked token")
    masked, trained = movement_z(e, "masked"), movement_z(e, "trained")
    if masked is None:
        return Undecided(
            f"fewer than {MIN_RESPONSES // 2} responses of each advantage sign with masked tokens and "
            "prox_logp after minibatch 0"
        )
    dm, zm, sm, n = masked
    dt, st = (trained[0], trained[2]) if trained is not None else (0.0, 0.0)
    beyond = (dm - dt) / (sm * sm + st * st) ** 0.5 if sm else 0.0  # few trained tokens: against 0
    if zm < MASKED_MOVES or beyond < MORE_THAN_TRAINED:
        return None
    trained_text = (
        f"the trained tokens {dt:.3g}" if trained is not None else "too few trained tokens to compare"
    )
    return Finding(
        "loss_mask_movement", e.run_id, "loss_mask", int(n),
        f"between prox and theta, the masked tokens of positive-advantage responses gain {dm:.3g} nats on "
        f"those of negative-advantage ones (z {zm:.1f}), {trained_text}: the tokens the loss trains are the "
        "ones marked masked",
        zm, f"z >= {MASKED_MOVES:g}, and {MORE_THAN_TRAINED:g} beyond the trained tokens'",
        e.example("masked_moves"),
        "that loss_mask is true on the tokens the loss trains (not inverted, not the prompt's or the tool "
        "outputs')",
    )  # fmt: skip
