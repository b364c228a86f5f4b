"""Checks of the minibatches of a step: every one recorded with one n_minibatches; theta equals prox at
minibatch 0 and moves away from it as the minibatches pass; prox is the same for every minibatch (the
weights at the start of the step)."""

from __future__ import annotations

import polars as pl

from evaluator.problems import Finding
from evaluator.validate.evidence import RunEvidence
from evaluator.validate.verdicts import (
    EXACT_SHARE,
    MIN_TOKENS,
    THETA_NOISE,
    Undecided,
    Verdict,
    too_few,
)

THETA_LIKE_LATER = 0.5
"""At minibatch 0, a gap at or above this share of the later minibatches' looks like a later one."""
RISING = 0.4
"""Of the pairs of minibatches (from minibatch 1 on) of one step, |theta - prox| is the larger at the
later one in 65% (8 minibatches, lr 1e-2: theta stops moving after the first updates) to 95% of pairs
on clean runs; under 40%, the index runs against the updates (minibatches swapped: 5%). A random order
(50%) cannot be told from a policy that stops moving."""
PROX_LIKE_THETA = 0.5
"""Between the first and the last minibatch, at the freshest staleness, |prox - behave| should not move
(prox is fixed for the step) while |theta - behave| does; prox moving by half of theta's move or more
follows theta (clean: -0.1 to 0.1; prox recomputed per minibatch: 1)."""
PROX_MOVE_Z = 4.0
"""... and by 4 standard errors of the two minibatches' different tokens: a drift dominated by another
cause (an engine at another temperature) differs between minibatches by noise alone."""
REPEAT_DIFFERS = 0.01
"""A response recorded in several minibatches of a step carries the same prox_logp in each; more than
1% of them (and 3 at least) with another is no rounding."""


def _later(e: RunEvidence) -> pl.DataFrame:
    return e.cells.filter(pl.col("minibatch") > 0)


def theta_at_minibatch_0(e: RunEvidence, _) -> Verdict:
    first, later = e.cells.filter(pl.col("minibatch") == 0), _later(e)
    n0 = int(first["n_prox"].sum())
    if undecided := too_few(n0, "tokens with prox_logp at minibatch 0"):
        return undecided
    gap0 = first["theta_gap"].sum() / n0
    n_later = int(later["n_prox"].sum())
    gap_later = later["theta_gap"].sum() / n_later if n_later else None
    if gap0 <= THETA_NOISE or (gap_later is not None and gap0 < THETA_LIKE_LATER * gap_later):
        return None
    later_text = f", {gap_later:.3g} at later minibatches" if gap_later is not None else ""
    return Finding(
        "theta_not_prox_at_minibatch_0", e.run_id, "theta_logp", n0,
        "at minibatch 0 theta_logp should equal prox_logp (a step starts from the proximal weights), but "
        f"their mean gap is {gap0:.3g} nats over {n0:,} tokens{later_text}",
        gap0, f"> {THETA_NOISE} nats and >= {THETA_LIKE_LATER} x the later minibatches'",
        e.cell_examples(pl.col("minibatch") == 0),
        "the minibatch index and n_minibatches the trainer records, and that theta is recorded before the "
        "optimizer step",
    )  # fmt: skip


def theta_moves(e: RunEvidence, _) -> Verdict:
    """theta_equals_prox: at a later minibatch theta is prox bit for bit (no update before it);
    theta_gap_order: |theta - prox| does not rise with the minibatch index."""
    later = _later(e).group_by("minibatch").agg(pl.col("n_prox").sum(), pl.col("theta_is_prox").sum())
    later = later.filter(pl.col("n_prox") >= MIN_TOKENS).sort("minibatch")
    if later.is_empty():
        none = _later(e).is_empty()
        return Undecided(
            "one minibatch per step" if none else "too few tokens with prox_logp after minibatch 0"
        )
    same = later.filter(pl.col("theta_is_prox") >= EXACT_SHARE * pl.col("n_prox"))
    if same.height:
        n, k = int(same["n_prox"].sum()), int(same["theta_is_prox"].sum())
        where = ", ".join(map(str, same["minibatch"]))
        return Finding(
            "theta_equals_prox", e.run_id, "theta_logp", k,
            f"at minibatch {where} theta_logp equals prox_logp bit for bit on {k:,} of {n:,} tokens: no "
            "update happened before those minibatches (or theta was recorded from the recompute pass)",
            k / n, f">= {EXACT_SHARE:.0%} of the tokens",
            e.cell_examples(pl.col("minibatch").is_in(same["minibatch"].to_list())),
            "that theta comes from the training forward after the step's earlier updates: the optimizer "
            "steps at every minibatch (not every few micro-batches), and minibatch counts updates",
        )  # fmt: skip
    return _gap_order(e)


def _gap_order(e: RunEvidence) -> Verdict:
    steps = _later(e).group_by("step", "minibatch").agg(pl.col("n_prox").sum(), pl.col("theta_gap").sum())
    gap = steps.filter(pl.col("n_prox") > 0).with_columns(
        (pl.col("theta_gap") / pl.col("n_prox")).alias("gap")
    )
    pairs = gap.join(gap, on="step", suffix="_later").filter(pl.col("minibatch") < pl.col("minibatch_later"))
    if pairs.height < 10:
        return Undecided(
            f"{pairs.height} pairs of minibatches after minibatch 0 in one step, fewer than 10 (3+ "
            "minibatches a step needed)"
        )
    last = gap.filter(pl.col("minibatch") == gap["minibatch"].max())
    moved = last["theta_gap"].sum() / last["n_prox"].sum()
    if moved < 2 * THETA_NOISE:
        return Undecided(
            f"theta moves {moved:.3g} nats from prox by the last minibatch, too little to order them"
        )
    rising = float((pairs["gap_later"] > pairs["gap"]).mean())
    if rising >= RISING:
        return None
    falling = pairs.filter(pl.col("gap_later") <= pl.col("gap")).sort("step").head(3)
    at = [
        (pl.col("step") == s) & (pl.col("minibatch") == m)
        for s, m in falling.select("step", "minibatch").rows()
    ]
    return Finding(
        "theta_gap_order", e.run_id, "minibatch", int(gap["n_prox"].sum()),
        "theta_logp should move away from prox_logp as the minibatches of a step pass, but of "
        f"{pairs.height:,} pairs of minibatches of one step, |theta - prox| is larger at the later one in "
        f"only {rising:.0%} (up to {moved:.3g} nats at the last minibatch)",
        rising, f"< {RISING:.0%} of the pairs",
        e.cell_examples(pl.any_horizontal(at)),
        "that the minibatch index counts the optimizer updates of the step in order (not a data-parallel "
        "rank or a shuffled batch index)",
    )  # fmt: skip


def prox_fixed(e: RunEvidence, _) -> Verdict:
    """prox_differs_across_minibatches (a response in several minibatches) and prox_moves_with_theta."""
    rep = e.repeats
    repeated, differs = float(rep["repeated"].sum()), float(rep["differs"].sum())
    if differs >= 3 and differs > REPEAT_DIFFERS * repeated:
        return Finding(
            "prox_differs_across_minibatches", e.run_id, "prox_logp", int(differs),
            f"{int(differs):,} of {int(repeated):,} responses recorded again in a later minibatch of their "
            "step carry another prox_logp there (by more than 1e-3 nats on average): prox is the weights "
            "at the start of the step, the same for every minibatch",
            differs / repeated, f"> {REPEAT_DIFFERS:.0%} of the repeated responses",
            e.example("prox_repeat_differs"),
            "that prox_logp is computed once per step, before the first update, and reused by every "
            "minibatch",
        )  # fmt: skip
    return _prox_moves(e)


def _prox_moves(e: RunEvidence) -> Verdict:
    """At the freshest staleness with enough tokens (where drift is smallest, so least noisy), the change
    of |prox - behave| from minibatch 0 to the last against that of |theta - behave|."""
    cells = e.cells.filter(pl.col("n_prox") > 0)
    last_mb = int(cells["minibatch"].max()) if cells.height else 0
    if last_mb == 0:
        return Undecided("one minibatch per step (or prox_logp at minibatch 0 only)")
    by = cells.group_by("staleness", "minibatch").agg(
        pl.col("n_prox", "drift", "drift_sq", "theta_drift").sum()
    )
    first = by.filter(pl.col("minibatch") == 0)
    both = first.join(by.filter(pl.col("minibatch") == last_mb), on="staleness", suffix="_last")
    both = both.filter(pl.min_horizontal("n_prox", "n_prox_last") >= MIN_TOKENS).sort("staleness")
    if both.is_empty():
        return Undecided(
            f"no staleness level with {MIN_TOKENS}+ tokens with prox_logp at minibatches 0 and {last_mb}"
        )
    row = both.row(0, named=True)
    theta_move = row["theta_drift_last"] / row["n_prox_last"] - row["theta_drift"] / row["n_prox"]
    prox_move = row["drift_last"] / row["n_prox_last"] - row["drift"] / row["n_prox"]
    if theta_move < THETA_NOISE:
        return Undecided(
            f"|theta - behave| changes by {theta_move:.3g} nats from minibatch 0 to {last_mb} (staleness "
            f"{row['staleness']}), too little to tell whether prox follows it"
        )
    ratio = prox_move / theta_move
    if ratio < PROX_LIKE_THETA or prox_move < PROX_MOVE_Z * _drift_se(row):
        return None
    return Finding(
        "prox_moves_with_theta", e.run_id, "prox_logp", int(row["n_prox"] + row["n_prox_last"]),
        f"at staleness {row['staleness']}, |prox - behave| grows by {prox_move:.3g} nats from minibatch 0 "
        f"to minibatch {last_mb}, {ratio:.2f} of theta's {theta_move:.3g}: prox follows theta through the "
        "step instead of staying at the step's starting weights",
        ratio, f">= {PROX_LIKE_THETA} of theta's change",
        e.cell_examples((pl.col("minibatch") == last_mb) & (pl.col("staleness") == row["staleness"])),
        "that the recompute pass runs once per step before the first update, not per minibatch",
    )  # fmt: skip


def _drift_se(row: dict) -> float:
    """The standard error of the difference of the two minibatches' mean |prox - behave| (tokens as if
    independent: the z threshold allows for their correlation within a response)."""
    var = 0.0
    for end in ("", "_last"):
        n, mean = row[f"n_prox{end}"], row[f"drift{end}"] / row[f"n_prox{end}"]
        var += max(row[f"drift_sq{end}"] / n - mean * mean, 0.0) / n
    return var**0.5


def minibatches_recorded(e: RunEvidence, _) -> Verdict:
    """incomplete_step and n_minibatches_varies."""
    steps = e.cells.group_by("step").agg(
        pl.col("n_minibatches").max(),
        pl.col("n_minibatches_min").min(),
        pl.col("minibatch").n_unique().alias("present"),
        (pl.col("n") + pl.col("n_masked")).sum().alias("rows"),
    )
    mixed = steps.filter(pl.col("n_minibatches_min") < pl.col("n_minibatches")).sort("step")
    if mixed.height:
        first = mixed.row(0, named=True)
        return Finding(
            "n_minibatches_varies", e.run_id, "n_minibatches", int(mixed["rows"].sum()),
            f"{mixed.height:,} steps carry several n_minibatches values (e.g. step {first['step']}: "
            f"{first['n_minibatches_min']} and {first['n_minibatches']}); a step has one number of "
            "minibatches",
            float(mixed.height), "> 0 steps",
            e.cell_examples(pl.col("step") == first["step"]),
            "that n_minibatches is the step's number of optimizer updates, recorded the same on every row",
        )  # fmt: skip
    short = steps.filter(pl.col("present") < pl.col("n_minibatches")).sort("step")
    if short.is_empty():
        return None
    first = short.row(0, named=True)
    return Finding(
        "incomplete_step", e.run_id, "minibatch", int(short["rows"].sum()),
        f"{len(short):,} steps carry fewer distinct minibatch indices than their n_minibatches (e.g. step "
        f"{first['step']}: {first['present']} of {first['n_minibatches']}): a minibatch was not recorded, "
        "or n_minibatches is wrong",
        float(short.height), "> 0 steps",
        e.cell_examples(pl.col("step") == first["step"]),
        "that the hook is called for every minibatch (and that this call holds every file of the run)",
    )  # fmt: skip
