"""Checks of proximal_t (DOMAIN.md section 4, seeds/001): per token, a token followed by a later segment
carries its log-prob under the next version, refreshed by the resume (so not behave_logp, and closer to
prox than behave); per resumed segment, every token of it is refreshed; the last segment keeps its own
generation log-prob."""

from __future__ import annotations

import polars as pl

from evaluator.problems import Finding
from evaluator.validate.evidence import RunEvidence
from evaluator.validate.verdicts import EXACT_SHARE, MIN_TOKENS, Undecided, Verdict, too_few

PARTIAL_SHARE = 0.05
"""Of the tokens whose proximal_t claims the next version (log-prob below -0.01), at most 0.02% kept
behave_logp bit for bit on the clean runs; 5% is a resume that refreshed some of the tokens only."""
PROXIMAL_T_WORSE = 1.2
"""proximal_t (one version fresher than behave) is expected closer to prox than behave; 1.2x farther
over 300+ tokens is no noise: the values sit on the wrong tokens."""
AS_OLD_AS_BEHAVE = 0.97
"""On the tokens whose proximal_t claims the next version, sum |proximal_t - prox| / sum |behave - prox|
(the same tokens): one version fresher, proximal_t sits closer (clean logs: 0.72 to 0.85); at 0.97 or
more it is as far as behave itself, recomputed under the token's own version."""
TELLABLE = 0.85
"""... judged only where one version's drift is a real share of the drift: the drift of the claimed
versions' tokens over that of one version older (expected ratio) at most 0.85. Where the engine mismatch
dwarfs a version's drift (a tiny learning rate) both ratios near 1 and the check stays quiet."""
EARLIER_CLOSER = 0.48
"""Of consecutive resumed segments of a response, the earlier (one version older) is the closer to prox
in 0% to 40% of pairs on clean logs; about half (a coin flip) when every resume overwrote every token."""
LAST_MOVED = 0.5
"""The last segment's proximal_t is its generation log-prob, bit for bit equal to behave_logp on 100%
of the clean runs' tokens; on half or fewer, it was overwritten or computed elsewhere."""


def _no_proximal_t(e: RunEvidence) -> Undecided | None:
    if e.proximal_t["n"].sum() == 0 and e.refresh["last_tokens"].sum() == 0:
        return Undecided("no proximal_t_logp (or no resumed response)")
    return None


def refresh(e: RunEvidence, _) -> Verdict:
    """proximal_t_not_updated (nearly no token refreshed) and proximal_t_partial_update (some)."""
    if undecided := _no_proximal_t(e):
        return undecided
    pt, r = e.proximal_t, e.refresh
    n, same = int(pt["n"].sum()), int(pt["pt_is_behave"].sum())
    if n >= MIN_TOKENS and same >= EXACT_SHARE * n:
        return Finding(
            "proximal_t_not_updated", e.run_id, "proximal_t_logp", same,
            f"proximal_t_version says the resume prefill recomputed {n:,} tokens under the next version, "
            "but proximal_t_logp equals behave_logp on nearly all of them: the update never happened",
            same / n, f">= {EXACT_SHARE:.0%} of those tokens", e.example("pt_followed"),
            "the resume path of the inference engine (seeds/001: tokens of version v - 1 take the new "
            "log-prob)",
        )  # fmt: skip
    compared, stale = float(r["compared"].sum()), float(r["stale"].sum())
    if undecided := too_few(compared, "tokens claiming the next version with a log-prob below -0.01"):
        return undecided
    share = stale / compared
    if share < PARTIAL_SHARE:
        return None
    segments, partial, wholly = (float(r[c].sum()) for c in ("segments", "partial", "stale_segments"))
    return Finding(
        "proximal_t_partial_update", e.run_id, "proximal_t_logp", int(stale),
        f"{int(stale):,} of {int(compared):,} tokens whose proximal_t claims the next version kept "
        f"behave_logp bit for bit ({share:.1%}): of {int(segments):,} resumed segments, {int(partial):,} "
        f"were refreshed on some tokens only and {int(wholly):,} on none",
        share, f">= {PARTIAL_SHARE:.0%} of those tokens", e.example("pt_stale"),
        "that a resume recomputes every token of the earlier segments (a prefix cache or a chunked prefill "
        "must not keep their old log-probs)",
    )  # fmt: skip


def values(e: RunEvidence, _) -> Verdict:
    """proximal_t_is_prox, proximal_t_misplaced and proximal_t_wrong_version: proximal_t against prox."""
    if undecided := _no_proximal_t(e):
        return undecided
    pt = e.proximal_t
    n_prox = int(pt["n_prox"].sum())
    if undecided := too_few(n_prox, "tokens claiming the next version with prox_logp"):
        return undecided
    older = pt.filter(pl.col("k") >= 1)  # proximal_t of a version before the step's: never prox itself
    n_older, same = int(older["n_prox"].sum()), int(older["pt_is_prox"].sum())
    if n_older >= MIN_TOKENS and same >= EXACT_SHARE * n_older:
        return Finding(
            "proximal_t_is_prox", e.run_id, "proximal_t_logp", same,
            f"proximal_t_logp equals prox_logp bit for bit on {same:,} of {n_older:,} tokens whose "
            "proximal_t version is older than the step: the log-prob of another version, and of the "
            "engine, cannot be the trainer's recompute",
            same / n_older, f">= {EXACT_SHARE:.0%} of those tokens", e.example("pt_followed"),
            "where proximal_t comes from: the engine's resume prefill, not the trainer's recompute pass",
        )  # fmt: skip
    error, rollout = pt["error"].sum(), pt["rollout_error"].sum()
    if error > PROXIMAL_T_WORSE * rollout:
        return Finding(
            "proximal_t_misplaced", e.run_id, "proximal_t_logp", n_prox,
            f"proximal_t_logp is farther from prox_logp than behave_logp itself on {n_prox:,} tokens (mean "
            f"{error / n_prox:.3g} vs {rollout / n_prox:.3g} nats), though it is one version fresher: the "
            "values sit on the wrong tokens",
            error / rollout if rollout else None, f"> {PROXIMAL_T_WORSE} x behave's distance",
            e.example("pt_followed"),
            "proximal_t's length and offset against the output tokens (seeds/000, bug 1)",
        )  # fmt: skip
    ratio, expected = _as_old_as_behave(pt, e.drift_by_staleness())
    if ratio is not None and expected <= TELLABLE and ratio >= AS_OLD_AS_BEHAVE:
        return Finding(
            "proximal_t_wrong_version", e.run_id, "proximal_t_logp", n_prox,
            f"proximal_t_logp claims the version after behave_version, but on those {n_prox:,} tokens it is "
            f"as far from prox_logp as behave_logp ({ratio:.3f} of behave's distance; one version fresher, "
            f"about {expected:.2f} is expected): it was recomputed under the token's own version",
            ratio, f">= {AS_OLD_AS_BEHAVE} of behave's distance", e.example("pt_followed"),
            "that the resume prefill runs after the new weights are loaded",
        )  # fmt: skip
    pairs = e.segment_pairs
    n_pairs, closer = int(pairs["pairs"].sum()), int(pairs["earlier_closer"].sum())
    if n_pairs >= MIN_TOKENS and closer >= EARLIER_CLOSER * n_pairs:
        return Finding(
            "proximal_t_wrong_version", e.run_id, "proximal_t_logp", n_pairs,
            f"in {closer:,} of {n_pairs:,} pairs of consecutive resumed segments of one response, the "
            "earlier segment's proximal_t sits closer to prox_logp than the later one's, though it is one "
            "version older: as if every resume overwrote every token (seeds/001)",
            closer / n_pairs, f">= {EARLIER_CLOSER:.0%} of the pairs", e.example("pt_followed"),
            "that a resume updates only the tokens of the version just replaced",
        )  # fmt: skip
    return None


def _as_old_as_behave(pt: pl.DataFrame, drift: dict[int, tuple[int, float]]) -> tuple[float | None, float]:
    """(sum |proximal_t - prox| / sum |behave - prox| on proximal_t's tokens, the ratio expected of one
    version fresher: sum_k n_k D(k) / sum_k n_k D(k + 1), D(k) the mean drift at staleness k and
    k = step - proximal_t_version). (None, 1) with too few tokens."""
    rows = [
        (k, n, err, roll)
        for k, n, err, roll in pt.filter(pl.col("n_prox") > 0)
        .select("k", "n_prox", "error", "rollout_error")
        .rows()
        if k in drift and k + 1 in drift
    ]
    n, rollout = sum(r[1] for r in rows), sum(r[3] for r in rows)
    older = sum(n_k * drift[k + 1][1] for k, n_k, _, _ in rows)
    if n < MIN_TOKENS or rollout <= 0 or older <= 0:
        return None, 1.0
    claimed = sum(n_k * drift[k][1] for k, n_k, _, _ in rows)
    return sum(r[2] for r in rows) / rollout, claimed / older


def last_segment(e: RunEvidence, _) -> Verdict:
    """proximal_t_last_segment: the last segment's proximal_t is not its own generation log-prob."""
    r = e.refresh
    tokens, moved = float(r["last_tokens"].sum()), float(r["last_moved"].sum())
    if tokens == 0:
        return Undecided("no proximal_t_logp")
    if undecided := too_few(tokens, "tokens of last segments with proximal_t_logp"):
        return undecided
    if moved / tokens < LAST_MOVED:
        return None
    return Finding(
        "proximal_t_last_segment", e.run_id, "proximal_t_logp", int(moved),
        f"on {int(moved):,} of {int(tokens):,} tokens of the last segment of their response "
        "(proximal_t_version = behave_version) proximal_t_logp differs from behave_logp: no resume "
        "followed them, so they keep their generation log-prob",
        moved / tokens, f">= {LAST_MOVED:.0%} of those tokens", e.example("pt_last_moved"),
        "where the adapter fills proximal_t for tokens no resume recomputed: with the engine's generation "
        "log-prob, not the trainer's",
    )  # fmt: skip
