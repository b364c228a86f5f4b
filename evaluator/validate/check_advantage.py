"""Checks of advantage and reward: over a response (constant for an outcome reward; where it varies,
aligned to the tokens), within a GRPO group (centred, rising with the reward), and against how the policy
moved (positive-advantage tokens become more likely under theta than under prox)."""

from __future__ import annotations

import polars as pl

from evaluator.problems import Finding
from evaluator.validate.evidence import RunEvidence
from evaluator.validate.groups import CENTRE
from evaluator.validate.verdicts import (
    MIN_RESPONSES,
    MIN_TOKENS,
    Undecided,
    Verdict,
    correlation,
    movement_z,
    too_few,
)

CONSTANT = 0.01
"""An outcome advantage is constant over a response: at most 1% of responses carrying several values ..."""
TOKEN_LEVEL = 0.9
"""... and a token-level one (GAE, process rewards) varies in every response of 2+ tokens: 90% or more.
Between the two, some responses carry a neighbour's advantage."""
EDGE_ONLY = 0.5
"""Responses whose advantage differs from the rest at their first or last trained token only: half of
the varying ones or more is an advantage rolled by one token (the edge takes the next response's)."""
ROLL_BEATS = 0.1
"""Token-level advantages: the correlation of the advantage's local detail with theta's movement at a
shift of one token beating shift 0 by 0.1 or more (over 300+ tokens) is a misalignment ..."""
ROLL_SIGNAL = 0.05
"""... judged only where some shift reaches a correlation of 0.05: below, theta's movement does not
follow the advantage token by token and the test cannot decide."""
MIN_PAIRS = 30
"""Pairs of equal rewards in one block needed to say whether blocks of that size are groups."""
MIN_BLOCKS = 3
"""Steps (or complete groups) needed to judge their centring, with MIN_RESPONSES responses among them."""
SAME_GROUP = 0.01
"""Blocks of a size are groups when at most 1% of their pairs of equal rewards carry different
advantages (clean runs: 0 at the group size and its divisors, 10% to 30% at other sizes)."""
OFF_CENTRE = 0.5
"""Half or more of the groups with a mean advantage off zero (`evaluator.validate.groups.CENTRE`): no
baseline was subtracted (clean: 0)."""
AGAINST = 0.8
"""Within groups, the advantage falls as the reward rises in 80%+ of pairs (clean: 0%) ..."""
AGAINST_CORRELATION = -0.2
"""... or, where no group can be found, the within-step correlation of advantage and reward is -0.2 or
less (clean runs: 0.58 to 0.89) ..."""
IGNORED = 0.1
"""... or between -0.2 and 0.1: the advantages do not follow the rewards logged next to them."""
AGAINST_MOVEMENT = -4.0
"""Welch's z of the movement theta - prox of positive- against negative-advantage responses after
minibatch 0 (clean: +1.7 to +19; the policy moves with the advantage it trains on): -4 or less, against."""
WITH_MOVEMENT = 2.0
"""z of 2 or more: the policy visibly moves with the advantage (passed); between, the test cannot tell."""


def _no_advantage(e: RunEvidence) -> Undecided | None:
    return Undecided("no advantage column") if e.advantage["a_responses"].sum() == 0 else None


def over_response(e: RunEvidence, _) -> Verdict:
    """advantage_varies (neither outcome nor token-level) and advantage_misaligned (edges differ)."""
    if undecided := _no_advantage(e):
        return undecided
    a = e.advantage
    n, varies = float(a["a_responses"].sum()), float(a["a_varies"].sum())
    if undecided := too_few(n, "responses with 2+ trained tokens", MIN_RESPONSES):
        return undecided
    long, edge = float(a["a_long"].sum()), float(a["a_edge_only"].sum())
    if long >= MIN_RESPONSES and edge >= EDGE_ONLY * long:
        return Finding(
            "advantage_misaligned", e.run_id, "advantage", int(edge),
            f"in {int(edge):,} of {int(long):,} responses whose advantage varies, it is constant but for "
            "the first or the last trained token: an advantage rolled by one token, the edge taking the "
            "neighbouring response's value",
            edge / long, f">= {EDGE_ONLY:.0%} of the varying responses", e.example("advantage_edge"),
            "how per-response advantages are spread over the tokens: the roll against the log-probs, and "
            "the response boundaries (cu_seqlens) of a packed batch",
        )  # fmt: skip
    share = varies / n
    if share <= CONSTANT or share >= TOKEN_LEVEL:
        return None
    return Finding(
        "advantage_varies", e.run_id, "advantage", int(varies),
        f"the advantage varies over the trained tokens of {share:.1%} of {int(n):,} responses and is "
        "constant over the others: neither an outcome advantage (constant) nor a token-level one (varies "
        "everywhere)",
        share, f"between {CONSTANT:.0%} and {TOKEN_LEVEL:.0%} of responses", e.example("advantage_varies"),
        "the response boundaries where advantages are broadcast to tokens (a neighbour's advantage on some "
        "tokens)",
    )  # fmt: skip


def alignment(e: RunEvidence, _) -> Verdict:
    """advantage_misaligned by the roll test, where the advantage varies within responses."""
    if undecided := _no_advantage(e):
        return undecided
    if e.advantage["a_varies"].sum() == 0:
        return Undecided("the advantage is constant within every response: no alignment to test")
    by = e.roll.group_by("shift").agg(pl.col("n", "sxy", "sxx", "syy").sum())
    fit = {r["shift"]: (r["n"], correlation(r["sxy"], r["sxx"], r["syy"])) for r in by.iter_rows(named=True)}
    n = min(v[0] for v in fit.values())
    if undecided := too_few(n, "trained tokens with a varying advantage and prox_logp after minibatch 0"):
        return undecided
    best = max(fit, key=lambda s: fit[s][1])
    if fit[best][1] < ROLL_SIGNAL:
        return Undecided(
            "theta's movement does not follow the advantage token by token (best correlation "
            f"{fit[best][1]:.3f})"
        )
    if best == 0 or fit[best][1] - fit[0][1] < ROLL_BEATS:
        return None
    return Finding(
        "advantage_misaligned", e.run_id, "advantage", int(n),
        f"the advantage fits theta's movement better shifted by {best:+d} token (correlation of their local "
        f"detail {fit[best][1]:.3f} vs {fit[0][1]:.3f} at shift 0, over {int(n):,} tokens): advantage at "
        f"pos i{best:+d} drives the token at pos i",
        fit[best][1] - fit[0][1], f">= {ROLL_BEATS} over shift 0", e.example("advantage_varies"),
        "the roll of the advantages against the log-probs (next-token alignment)",
    )  # fmt: skip


def _group_size(e: RunEvidence) -> int | None:
    """The largest block size (0: the whole step) whose equal rewards carry equal advantages."""
    sizes = e.groups.group_by("size").agg(pl.col("pairs_equal", "violations").sum())
    ok = sizes.filter(
        (pl.col("pairs_equal") >= MIN_PAIRS) & (pl.col("violations") <= SAME_GROUP * pl.col("pairs_equal"))
    )
    if ok.is_empty():
        return None
    found = ok["size"].to_list()
    return 0 if 0 in found else max(found)


def _at(e: RunEvidence, size: int) -> dict:
    return (
        e.groups.filter(pl.col("size") == size).select(pl.exclude("run_id", "size")).sum().row(0, named=True)
    )


def _constant(e: RunEvidence) -> Undecided | None:
    a = e.advantage
    if a["a_varies"].sum() > CONSTANT * a["a_responses"].sum():
        return Undecided(
            "the advantage varies within responses (token-level): no response-level group to check"
        )
    return None


def _where(size: int) -> str:
    return "steps" if size == 0 else f"groups of {size} consecutive seq_ids"


def _off(e: RunEvidence, size: int) -> tuple[float, float] | None:
    """(blocks off centre, blocks) at a block size, None with too few to judge."""
    at = _at(e, size)
    enough = at["blocks"] >= MIN_BLOCKS and at["in_blocks"] >= MIN_RESPONSES
    return (at["off_centre"], at["blocks"]) if enough else None


def centred(e: RunEvidence, _) -> Verdict:
    """advantage_not_centred: steps, and the groups found in them, whose mean advantage is off zero. A
    step of whole groups is centred whenever its groups are; blocks that cut groups are not, so the step
    decides, and a group size found (a block of it can be part of a group) only confirms."""
    if undecided := _no_advantage(e) or _constant(e):
        return undecided
    step = _off(e, 0)
    if step is None:
        return Undecided(f"fewer than {MIN_BLOCKS} steps or {MIN_RESPONSES} responses")
    size = _group_size(e)
    group = _off(e, size) if size else None
    if any(off < OFF_CENTRE * blocks for off, blocks in filter(None, (step, group))):
        return None
    chosen, (off, blocks) = (size, group) if group else (0, step)
    return Finding(
        "advantage_not_centred", e.run_id, "advantage", int(off),
        f"{int(off):,} of {int(blocks):,} {_where(chosen)} have a mean advantage off zero (by more than "
        f"{CENTRE} of the run's RMS advantage){' and so do the steps' if group else ''}: no baseline (the "
        "group's mean reward) was subtracted",
        off / blocks, f">= {OFF_CENTRE:.0%} of them", e.example(f"group_off_centre:{chosen}"),
        "the advantage estimator: GRPO subtracts the group's mean reward (the responses to one prompt)",
    )  # fmt: skip


def against_reward(e: RunEvidence, _) -> Verdict:
    """advantage_against_reward (falls as the reward rises), advantage_ignores_reward, and reward_constant
    (one reward a step while the advantages differ)."""
    if undecided := _no_advantage(e):
        return undecided
    if e.advantage["r_responses"].sum() == 0:
        return Undecided("no reward column")
    size = _group_size(e)
    if size is not None:
        g = _at(e, size)
        pairs = g["concordant"] + g["discordant"]
        if pairs >= MIN_PAIRS and g["discordant"] >= AGAINST * pairs:
            return _against(
                e,
                g["discordant"],
                f"in {int(g['discordant']):,} of {int(pairs):,} pairs of responses within {_where(size)}, "
                "the higher reward has the lower advantage",
                g["discordant"] / pairs,
                f">= {AGAINST:.0%} of pairs",
                f"group_discordant:{size}",
            )
        if pairs >= MIN_PAIRS:
            return None
    whole = _at(e, 0)
    if undecided := too_few(whole["n_corr"], "responses with a reward", MIN_TOKENS):
        return undecided
    r = correlation(whole["sxy"], whole["sxx"], whole["syy"])
    if whole["syy"] == 0 and whole["sxx"] > 0:
        return Finding(
            "reward_constant", e.run_id, "reward", int(whole["n_corr"]),
            f"the reward is the same for every one of {int(whole['n_corr']):,} responses within each step, "
            "while their advantages differ: the advantages were computed from other rewards than the column "
            "holds",
            0.0, "reward spread 0 within every step, advantage spread > 0", e.cell_examples(pl.col("n") > 0),
            "which reward the adapter writes: the score the advantages were computed from, not a default or "
            "a field left empty",
        )  # fmt: skip
    if whole["syy"] == 0:
        return Undecided("the reward and the advantage are the same for every response of each step")
    if r <= AGAINST_CORRELATION:
        return _against(
            e,
            whole["n_corr"],
            f"the advantage falls as the reward rises: within steps their correlation is {r:.2f} over "
            f"{int(whole['n_corr']):,} responses",
            r,
            f"<= {AGAINST_CORRELATION}",
            "group_discordant:0",
        )
    if r >= IGNORED:
        return None
    return Finding(
        "advantage_ignores_reward", e.run_id, "advantage", int(whole["n_corr"]),
        f"within steps the advantage and the reward of the same responses correlate at {r:.2f} over "
        f"{int(whole['n_corr']):,} responses: the advantages do not belong to the rewards logged beside them",
        r, f"between {AGAINST_CORRELATION} and {IGNORED}", e.example("group_discordant:0"),
        "that advantages and rewards are attached to the same responses (an ordering or a gather over the "
        "batch that mixes responses)",
    )  # fmt: skip


def _against(e: RunEvidence, rows: float, message: str, figure: float, threshold: str, kind: str) -> Finding:
    advice = "the advantage's sign: reward - baseline, not its negative (and the reward's, if it is a cost)"
    return Finding("advantage_against_reward", e.run_id, "advantage", int(rows), message, figure, threshold,
                   e.example(kind), advice)  # fmt: skip


def against_movement(e: RunEvidence, _) -> Verdict:
    """advantage_against_movement: the policy moves against the advantage it should train on."""
    if undecided := _no_advantage(e):
        return undecided
    trained = movement_z(e, "trained")
    if trained is None:
        return Undecided(
            f"fewer than {MIN_RESPONSES // 2} responses of each advantage sign with prox_logp after "
            "minibatch 0 (one minibatch per step?)"
        )
    diff, z, _, n = trained
    if z >= WITH_MOVEMENT:
        return None
    if z > AGAINST_MOVEMENT:
        return Undecided(
            f"theta moves {diff:+.3g} nats more on positive- than negative-advantage responses (z {z:.1f}): "
            "too little to tell"
        )
    return Finding(
        "advantage_against_movement", e.run_id, "advantage", int(n),
        f"from prox to theta, positive-advantage responses lose {-diff:.3g} nats against negative-advantage "
        f"ones (z {z:.1f} over {int(n):,} responses): the policy moves against the advantage logged",
        z, f"z <= {AGAINST_MOVEMENT:g}", e.example("against_advantage"),
        "the loss's sign (minimise -A * ratio) and that the advantage logged is the one the loss uses",
    )  # fmt: skip


def reward_over_response(e: RunEvidence, _) -> Verdict:
    """reward_varies: the sequence reward is not the same on every token of a response."""
    a = e.advantage
    n, varies = float(a["r_responses"].sum()), float(a["r_varies"].sum())
    if n == 0:
        return Undecided("no reward column")
    if undecided := too_few(n, "responses with a reward", MIN_RESPONSES):
        return undecided
    if varies < 3 or varies < CONSTANT * n:
        return None
    return Finding(
        "reward_varies", e.run_id, "reward", int(varies),
        f"the reward varies over the tokens of {int(varies):,} of {int(n):,} responses; it is the sequence "
        "reward, repeated on each of its tokens",
        varies / n, f">= {CONSTANT:.0%} of responses", e.example("reward_varies"),
        "which reward tensor the adapter writes: the sequence score, not token-level rewards (a score on "
        "the last token, zeros elsewhere)",
    )  # fmt: skip
