"""Checks of behave_version and step over the run: versions count weight updates as steps do, the
freshest version advances with the steps, staleness stays in a bounded range, and the drift from prox
grows with staleness (the versions measure how far the policy moved), not with the step at a given
staleness (the engine loads the versions it reports)."""

from __future__ import annotations

import numpy as np
import polars as pl

from evaluator.problems import Finding
from evaluator.validate.evidence import RunEvidence
from evaluator.validate.verdicts import MIN_TOKENS, THETA_NOISE, Undecided, Verdict, too_few

FRESH_LIKE = 0.5
"""Drift at the lowest staleness under half of one version's drift increase looks like fresh tokens."""
GAP_FACTOR = 2
"""Without --max-staleness, a staleness more than twice the run's usual range (plus 2) with no token at
the levels between is far outside it."""
USUAL_SHARE = 0.99
"""The run's usual staleness range: the levels holding 99% of its tokens."""
STALL_STEPS = 12
"""The freshest version of a step's tokens stays the same over at most 3 consecutive steps on the clean
runs (staleness up to 8); over 12 or more, the tokens of those steps grow one version staler per step."""
VERSION_RATE = 0.6
"""The freshest version of a step's tokens advances by one per step on the clean runs (1.00 on every one:
staleness 0, or the same lowest staleness, in every step); under 0.6 the steps count something else than
the weight versions (a stalled counter: 0; steps counted twice as fast: 0.5)."""
FLOOR_LIMIT = 3.0
"""The drift at the lowest staleness (the engine mismatch) is at most 1.2x theta's movement per version
on the clean runs (SmolLM2's bf16 engine); beyond 3x, versions' drift is too small a part to see grow."""
FOLLOW_STEPS = 8
"""Steps with prox_logp needed to tell a drift that grows with the step from one that grows with the
staleness."""
STEP_LIKE = 0.5
"""At a given staleness, |prox - behave| grows per step by 0.004x to 0.03x what it grows per staleness
level on the clean runs (SmolLM2's bf16 engine drifts from fp32 as its weights move: 0.0007 nats a step
against 0.025 a level); at half of it or more, the versions do not explain the drift, the steps do."""
FOLLOW_Z = 4.0
"""... by 4 standard errors of the growth per step (tokens as if independent)."""
GROWTH = 0.1
"""Drift should grow with staleness: per level, by about what the policy moves in one version (clean:
0.18 to 2.5 of theta's movement per version within a step); under 0.1 of it, the versions do not count
the updates."""


def version_count(e: RunEvidence, _) -> Verdict:
    """version_count: the freshest tokens are not those labelled staleness 0 (an off-by-one between
    behave_version and the weights the trainer's forward used)."""
    drift = {k: v for k, v in e.drift_by_staleness().items() if v[0] >= MIN_TOKENS}
    if 0 in drift and 1 in drift:
        return _fresher_at_1(e, drift[0][1], drift[1][1])
    steps = e.cells.group_by("step").agg(pl.col("staleness").max())
    warm = int(steps["step"].min() + steps["staleness"].max())  # past the first max-staleness steps
    late = e.cells.filter(pl.col("step") > warm)
    rows = late["n"] + late["n_masked"]  # masked tokens count too: they were generated all the same
    if undecided := too_few(late["n"].sum(), f"loss tokens after step {warm} (the warm-up)"):
        return undecided
    if rows.filter(late["staleness"] == 0).sum() > 0:
        return Undecided("too few tokens with prox_logp at staleness 0 and 1")
    lowest = int(late["staleness"].min())
    if lowest not in drift or lowest + 1 not in drift:
        return Undecided(f"too few tokens with prox_logp at staleness {lowest} and {lowest + 1}")
    low, step_up = drift[lowest][1], drift[lowest + 1][1] - drift[lowest][1]
    if step_up <= 0 or low >= FRESH_LIKE * step_up:
        return None
    return Finding(
        "version_count", e.run_id, "behave_version", int(late["n"].sum()),
        f"after step {warm} no token has staleness 0, yet the lowest staleness ({lowest}) drifts only "
        f"{low:.3g} nats from prox, less than half of one more version's increase ({step_up:.3g}): the "
        f"tokens labelled staleness {lowest} behave like fresh ones",
        low / step_up, f"< {FRESH_LIKE} of one version's drift increase",
        e.cell_examples(pl.col("staleness") == lowest),
        "that behave_version counts weight versions as step does (step s starts from version s): an "
        "off-by-one?",
    )  # fmt: skip


def _fresher_at_1(e: RunEvidence, d0: float, d1: float) -> Verdict:
    """Staleness 0 (the step's own weights) is the closest to prox, the engine mismatch alone."""
    if d1 >= d0:
        return None
    return Finding(
        "version_count", e.run_id, "behave_version", int(e.cells.filter(pl.col("staleness") <= 1)["n"].sum()),
        f"the tokens labelled staleness 1 drift {d1:.3g} nats from prox, less than those labelled 0 "
        f"({d0:.3g}): the step's own version should be the closest (the engine mismatch alone), so prox and "
        "theta come from the weights one version before the step's, or behave_version counts one ahead",
        d1 / d0, "< 1 (staleness 1 closer to prox than staleness 0)",
        e.cell_examples(pl.col("staleness") == 0),
        "that the recompute and training forwards of step s run on the weights of version s (the last "
        "update loaded), and that behave_version counts as step does",
    )  # fmt: skip


def staleness_range(e: RunEvidence, max_staleness: int | None) -> Verdict:
    """staleness_beyond_max (with --max-staleness) or staleness_gap."""
    by = e.cells.group_by("staleness").agg(pl.col("n").sum(), pl.col("step").min()).sort("staleness")
    if max_staleness is not None:
        beyond = by.filter(pl.col("staleness") > max_staleness)
        if beyond.is_empty():
            return None
        n = int(beyond["n"].sum())
        return Finding(
            "staleness_beyond_max", e.run_id, "behave_version", n,
            f"{n:,} tokens are staler than the configured maximum {max_staleness} (staleness up to "
            f"{beyond['staleness'].max()}, first at step {beyond['step'].min()})",
            float(beyond["staleness"].max()), f"> {max_staleness} (--max-staleness)",
            e.cell_examples(pl.col("staleness") > max_staleness),
            "that the trainer enforces its max_head_offpolicyness and counts versions as configured",
        )  # fmt: skip
    if by["n"].sum() == 0:
        return Undecided("no loss tokens")
    cumulative = by["n"].cum_sum() / by["n"].sum()
    usual = int(by.filter(cumulative >= USUAL_SHARE)["staleness"].min())
    far = by.filter(pl.col("staleness") > GAP_FACTOR * usual + 2)
    if far.is_empty():
        return None
    first_far = int(far["staleness"].min())
    if by.filter((pl.col("staleness") > usual) & (pl.col("staleness") < first_far)).height:
        return None  # a long tail, not a gap
    n = int(far["n"].sum())
    return Finding(
        "staleness_gap", e.run_id, "behave_version", n,
        f"{n:,} tokens have staleness {first_far}..{far['staleness'].max()}, far beyond the run's usual "
        f"0..{usual} with no token between: a frozen version counter or tokens from another run",
        float(first_far), f"> {GAP_FACTOR} x {usual} + 2 with no token between",
        e.cell_examples(pl.col("staleness") >= first_far),
        "the version counter and the run_id of those tokens; give --max-staleness (the trainer's "
        "max_head_offpolicyness) to make tokens beyond it an error",
    )  # fmt: skip


def _freshest(e: RunEvidence) -> pl.DataFrame:
    """Per step with rows (masked ones too: they were generated all the same), its freshest version."""
    rows = pl.col("n") + pl.col("n_masked")
    by = e.cells.filter(rows > 0).group_by("step")
    return by.agg((pl.col("step") - pl.col("staleness")).max().alias("freshest")).sort("step")


def version_stalled(e: RunEvidence, _) -> Verdict:
    """The freshest version per step (step - its lowest staleness) stays the same while steps pass."""
    steps = _freshest(e)
    if steps.height <= STALL_STEPS:
        return Undecided(f"{steps.height} steps, {STALL_STEPS + 1} needed to see a stall of {STALL_STEPS}")
    step, fresh = steps["step"].to_numpy(), steps["freshest"].to_numpy()
    began = np.maximum.accumulate(np.where(np.r_[True, fresh[1:] > fresh[:-1]], np.arange(len(step)), 0))
    length = step - step[began]
    end = int(np.argmax(length))
    if length[end] < STALL_STEPS:
        return None
    first, last = int(step[began[end]]), int(step[end])
    return Finding(
        "version_stalled", e.run_id, "behave_version",
        int(e.cells.filter(pl.col("step").is_between(first, last))["n"].sum()),
        f"from step {first} to step {last} the freshest token of every step has behave_version "
        f"{int(fresh[end])}: the version counter stopped while {int(length[end])} steps passed, and the "
        f"tokens grew one version staler per step (staleness {int(step[end] - fresh[end])} at step {last})",
        float(length[end]), f">= {STALL_STEPS} steps",
        e.cell_examples((pl.col("step") == last) & (pl.col("step") - pl.col("staleness") == int(fresh[end]))),
        "that the inference engine loads each new version and reports its number (a frozen counter, or an "
        "engine that stopped syncing weights)",
    )  # fmt: skip


def drift_growth(e: RunEvidence, _) -> Verdict:
    """drift_not_growing: |prox - behave| does not grow with staleness (from 1 on: staleness 0 is the
    engine mismatch alone) though the policy moves, and the engine mismatch is small enough to see it."""
    drift = {k: d for k, (n, d) in e.drift_by_staleness().items() if n >= MIN_TOKENS}
    stale = sorted(k for k in drift if k >= 1)
    if len(stale) < 3:
        return Undecided(
            f"{len(stale)} staleness levels of 1+ with {MIN_TOKENS}+ tokens with prox_logp, fewer than 3"
        )
    per_version = _movement_per_version(e)
    if per_version is None:
        return Undecided("one minibatch per step: no measure of how far the policy moves in one version")
    if per_version < THETA_NOISE:
        return Undecided(
            f"the policy moves {per_version:.3g} nats a version within a step, too little to expect drift "
            "to grow"
        )
    floor = drift[min(drift)]
    if floor > FLOOR_LIMIT * per_version:
        return Undecided(
            f"the drift at staleness {min(drift)} ({floor:.3g} nats) is over {FLOOR_LIMIT:g}x theta's "
            f"movement per version ({per_version:.3g}): an engine mismatch that large hides the growth"
        )
    slope = float(np.polyfit(np.array(stale, dtype=float), [drift[k] for k in stale], 1)[0])
    if slope >= GROWTH * per_version:
        return None
    n = int(e.cells.filter(pl.col("staleness") >= 1)["n_prox"].sum())
    return Finding(
        "drift_not_growing", e.run_id, "behave_version", n,
        f"|prox - behave| changes by {slope:.3g} nats per staleness level (levels {stale[0]}..{stale[-1]}) "
        f"while theta moves {per_version:.3g} nats per version within a step: older versions are not "
        "farther from prox, so behave_version does not count the weight updates",
        slope / per_version, f"< {GROWTH} of the movement per version",
        e.cell_examples(pl.col("staleness") == stale[-1]),
        "where behave_version comes from: the version of the weights that generated each token, counted as "
        "step counts updates",
    )  # fmt: skip


def _movement_per_version(e: RunEvidence) -> float | None:
    """Mean |theta - prox| at the last minibatch over its place in version time (m / n_minibatches)."""
    cells = e.cells.filter((pl.col("minibatch") > 0) & (pl.col("n_prox") > 0))
    if cells.is_empty():
        return None
    place = cells["minibatch"] / cells["n_minibatches"]
    return float(cells["theta_gap"].sum() / (cells["n_prox"] * place).sum())


def weights_loaded(e: RunEvidence, _) -> Verdict:
    """drift_follows_step: |prox - behave| grows with the step rather than with the staleness, as when
    the engine keeps generating with old weights while the version counter advances."""
    cells = e.cells.filter(pl.col("n_prox") > 0)
    if cells["step"].n_unique() < FOLLOW_STEPS:
        return Undecided(f"{cells['step'].n_unique()} steps with prox_logp, fewer than {FOLLOW_STEPS}")
    if undecided := too_few(cells["n_prox"].sum(), "loss tokens with prox_logp"):
        return undecided
    fit = _drift_fit(cells)
    if fit is None:
        return Undecided("too little spread in the steps to fit the drift against them")
    per_step, per_step_se, per_level, span = fit
    levels = cells.group_by("staleness").agg(pl.col("n_prox").sum()).filter(pl.col("n_prox") >= MIN_TOKENS)
    reference = per_level if levels.height >= 2 else _movement_per_version(e)
    if reference is None:
        return Undecided("one staleness level and one minibatch per step: nothing to compare the growth with")
    if per_step <= 0 or per_step < STEP_LIKE * reference:
        return None
    if per_step * span < 2 * THETA_NOISE or per_step < FOLLOW_Z * per_step_se:
        return Undecided(
            f"the drift grows by {per_step * span:.3g} nats over steps {span:g} apart at a given staleness "
            f"(z {per_step / per_step_se if per_step_se else 0:.1f}), too little to tell whether the engine "
            "lags the versions"
        )
    what = "per staleness level" if levels.height >= 2 else "per version of theta's movement"
    return Finding(
        "drift_follows_step", e.run_id, "behave_version", int(cells["n_prox"].sum()),
        f"|prox - behave| grows by {per_step:.3g} nats per step at a given staleness "
        f"(z {per_step / per_step_se:.1f}) against {reference:.3g} {what}: the tokens are as far from prox "
        "as the steps since some old weights, whatever their behave_version says, so the engine generated "
        "with weights older than the versions it reports",
        per_step / reference if reference > 0 else None, f">= {STEP_LIKE} of the growth {what}",
        e.cell_examples(pl.col("step") == cells["step"].max()),
        "that the inference engine really loads each new version before generating with it (a weight sync "
        "that fails or is skipped silently, an engine restarted from an old checkpoint)",
    )  # fmt: skip


def _drift_fit(cells: pl.DataFrame) -> tuple[float, float, float, float] | None:
    """The cells' mean drift fitted as a + b * staleness + c * step (weighted by tokens): (c, its standard
    error, b, the span of the steps); None when the steps do not vary enough to fit."""
    n = cells["n_prox"].to_numpy().astype(float)
    y = cells["drift"].to_numpy() / n
    x = np.stack([np.ones(len(n)), cells["staleness"].to_numpy(), cells["step"].to_numpy()], 1).astype(float)
    gram = x.T @ (x * n[:, None])
    if np.linalg.matrix_rank(gram) < 3:
        gram = gram[[0, 2]][:, [0, 2]]
        x = x[:, [0, 2]]
        if np.linalg.matrix_rank(gram) < 2:
            return None
    beta = np.linalg.solve(gram, x.T @ (y * n))
    within = (cells["drift_sq"].sum() - float((n * y * y).sum())) / max(n.sum() - len(n), 1.0)
    cov = max(within, 0.0) * np.linalg.inv(gram)
    step = cells["step"].to_numpy()
    per_level = float(beta[1]) if len(beta) == 3 else 0.0
    return float(beta[-1]), float(cov[-1, -1]) ** 0.5, per_level, float(step.max() - step.min())


def version_rate(e: RunEvidence, _) -> Verdict:
    """versions_slower_than_steps: the freshest version of a step's tokens advances by under VERSION_RATE
    per step (step s trains from weights of version s: one version a step)."""
    steps = _freshest(e)
    if steps.height <= STALL_STEPS:
        return Undecided(f"{steps.height} steps, {STALL_STEPS + 1} needed to measure how versions advance")
    step, fresh = steps["step"].to_numpy().astype(float), steps["freshest"].to_numpy().astype(float)
    rate = float(np.polyfit(step, fresh, 1)[0])
    if rate >= VERSION_RATE:
        return None
    first, last = int(step[0]), int(step[-1])
    return Finding(
        "versions_slower_than_steps", e.run_id, "behave_version", int(e.cells["n"].sum()),
        f"from step {first} to step {last} the freshest behave_version of a step advances by {rate:.2f} per "
        f"step (from {int(fresh[0])} to {int(fresh[-1])}): step s trains from the weights of version s, so "
        "it advances by one a step, and the tokens grow staler with every step instead",
        rate, f"< {VERSION_RATE} versions per step", e.cell_examples(pl.col("step") == last),
        "that step and behave_version count the same updates: one step per weight version (not a step per "
        "rollout, minibatch or epoch where the weights change once per several)",
    )  # fmt: skip
