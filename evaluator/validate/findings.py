"""Data-driven findings: what silently breaks training and leaves a clear signal in the data, judged per
run on the evidence of all the files of one call (`evaluator.validate.evidence`, added up).

Each finding names the rule, the evidence and what to check in the trainer. Severity **error**: the data
cannot be right (the run's files fail validation and replay skips them); **warning**: very likely wrong,
but a sane trainer could produce it (reported, stored with the run, exit code 0). The thresholds are
below, each with why; `docs/validate.md` lists them with the clean logs they were checked on.
"""

from __future__ import annotations

import polars as pl

from evaluator.problems import Finding
from evaluator.validate.evidence import Evidence, RunEvidence
from evaluator.validate.no_truth import no_ground_truth
from evaluator.validate.zero_prox import prox_logp_zero

MIN_TOKENS = 300
"""A finding needs at least this many tokens of the kind it looks at: fewer make a rate or a mean one
unlucky batch."""
THETA_NOISE = 0.02
"""Mean |theta - prox| at minibatch 0 (nats) under which theta equals prox up to numerical noise (the
same weights: an fp32 recompute matches to 1e-6, a bf16 autocast forward to about 1e-2)."""
THETA_LIKE_LATER = 0.5
"""... and at or above this share of the later minibatches' gap, minibatch 0 looks like a later one."""
EXACT_SHARE = 0.95
"""Share of tokens with two log-probs exactly equal above which they come from one source: two policies
of different versions never agree to the last float32 bit on 95% of stale tokens."""
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
EDGE_MASKED = 0.9
"""One edge position (first or last of a response) masked in 90%+ of responses ..."""
OTHER_MASKED = 0.2
"""... while at most 20% of the other tokens are: the fingerprint of a rolled loss mask."""
FRESH_LIKE = 0.5
"""Drift at the lowest staleness under half of one version's drift increase looks like fresh tokens."""
GAP_FACTOR = 2
"""Without --max-staleness, a staleness more than twice the run's usual range (plus 2) with no token at
the levels between is far outside it."""
USUAL_SHARE = 0.99
"""The run's usual staleness range: the levels holding 99% of its tokens."""
VERL_PROBLEM, NEMO_FLAG = 0.01, 1.05
"""The engine mismatch references of DOMAIN.md 3b: verl's mean |p_rollout - p_train| (normal below
0.005, a precision problem above 0.01) and NeMo-RL's mean exp(|logp_gen - logp_train|) flag (1.05). A
warning above verl's 0.01 only: the reference trainer's real bf16 engine on SmolLM2 sits at 0.006 (above
verl's "normal") with NeMo-RL's figure at 1.04, and NeMo-RL's mean of an exponential is carried by single
outlier tokens (a clean tiny run reached 4e64 from one token of a collapsed policy); it is reported in
the message, not judged."""


def _theta_at_minibatch_0(e: RunEvidence, _) -> Finding | None:
    first, later = e.cells.filter(pl.col("minibatch") == 0), e.cells.filter(pl.col("minibatch") > 0)
    n0 = int(first["n_prox"].sum())
    if n0 < MIN_TOKENS:
        return None
    gap0 = first["theta_gap"].sum() / n0
    n_later = int(later["n_prox"].sum())
    gap_later = later["theta_gap"].sum() / n_later if n_later else None
    if gap0 <= THETA_NOISE or (gap_later is not None and gap0 < THETA_LIKE_LATER * gap_later):
        return None
    later_text = f", {gap_later:.3g} at later minibatches" if gap_later is not None else ""
    return Finding(
        "theta_not_prox_at_minibatch_0", e.run_id, "theta_logp", n0,
        f"at minibatch 0 theta_logp should equal prox_logp (a step starts from the proximal weights), but "
        f"their mean gap is {gap0:.3g} nats over {n0:,} tokens{later_text}. Check the minibatch index and "
        "n_minibatches the trainer records, and that theta is recorded before the optimizer step",
    )  # fmt: skip


def _incomplete_steps(e: RunEvidence, _) -> Finding | None:
    steps = e.cells.group_by("step").agg(
        pl.col("n_minibatches").max(), pl.col("minibatch").n_unique().alias("present"), pl.col("n").sum()
    )
    short = steps.filter(pl.col("present") < pl.col("n_minibatches")).sort("step")
    if short.is_empty():
        return None
    first = short.row(0, named=True)
    return Finding(
        "incomplete_step", e.run_id, "minibatch", int(short["n"].sum()),
        f"{len(short):,} steps carry fewer distinct minibatch indices than their n_minibatches (e.g. step "
        f"{first['step']}: {first['present']} of {first['n_minibatches']}): a minibatch was not recorded, "
        "or n_minibatches is wrong. Check that the hook is called for every minibatch (and that this call "
        "holds every file of the run)",
    )  # fmt: skip


def _exact_source(e: RunEvidence, _) -> Finding | None:
    stale = e.cells.filter(pl.col("staleness") >= 1)
    for column, other, n_col in (
        ("behave_is_prox", "prox_logp", "n_prox"),
        ("behave_is_theta", "theta_logp", "n"),
    ):
        n = int(stale[n_col].sum())
        same = int(stale[column].sum())
        if n >= MIN_TOKENS and same >= EXACT_SHARE * n:
            return Finding(
                f"behave_is_{other.removesuffix('_logp')}", e.run_id, "behave_logp", same,
                f"behave_logp equals {other} exactly on {same:,} of {n:,} tokens generated by an older "
                f"version (staleness >= 1): impossible for two policies of different versions. Check where "
                f"the trainer takes the behaviour log-probs: from the inference engine at generation, not "
                f"from {'the recompute pass' if other == 'prox_logp' else 'the training forward pass'}",
            )  # fmt: skip
    return None


def _proximal_t(e: RunEvidence, _) -> Finding | None:
    pt = e.proximal_t
    n, n_prox = int(pt["n"].sum()), int(pt["n_prox"].sum())
    if n >= MIN_TOKENS and pt["pt_is_behave"].sum() >= EXACT_SHARE * n:
        return Finding(
            "proximal_t_not_updated", e.run_id, "proximal_t_logp", int(pt["pt_is_behave"].sum()),
            f"proximal_t_version says the resume prefill recomputed {n:,} tokens under the next version, but "
            "proximal_t_logp equals behave_logp on nearly all of them: the update never happened. Check the "
            "resume path of the inference engine (seeds/001: tokens of version v - 1 take the new log-prob)",
        )  # fmt: skip
    if n_prox < MIN_TOKENS:
        return None
    error, rollout = pt["error"].sum(), pt["rollout_error"].sum()
    if error > PROXIMAL_T_WORSE * rollout:
        return Finding(
            "proximal_t_misplaced", e.run_id, "proximal_t_logp", n_prox,
            f"proximal_t_logp is farther from prox_logp than behave_logp itself on {n_prox:,} tokens (mean "
            f"{error / n_prox:.3g} vs {rollout / n_prox:.3g} nats), though it is one version fresher: the "
            "values sit on the wrong tokens. Check proximal_t's length and offset against the output tokens "
            "(seeds/000, bug 1)",
        )  # fmt: skip
    ratio, expected = _as_old_as_behave(pt, e.drift_by_staleness())
    if ratio is not None and expected <= TELLABLE and ratio >= AS_OLD_AS_BEHAVE:
        return Finding(
            "proximal_t_wrong_version", e.run_id, "proximal_t_logp", n_prox,
            f"proximal_t_logp claims the version after behave_version, but on those {n_prox:,} tokens it "
            f"is as far from prox_logp as behave_logp ({ratio:.3f} of behave's distance; one version "
            f"fresher, about {expected:.2f} is expected): it was recomputed under the token's own version. "
            "Check that the resume prefill runs after the new weights are loaded",
        )  # fmt: skip
    pairs = e.segment_pairs
    n_pairs, closer = int(pairs["pairs"].sum()), int(pairs["earlier_closer"].sum())
    if n_pairs >= MIN_TOKENS and closer >= EARLIER_CLOSER * n_pairs:
        return Finding(
            "proximal_t_wrong_version", e.run_id, "proximal_t_logp", n_pairs,
            f"in {closer:,} of {n_pairs:,} pairs of consecutive resumed segments of one response, the "
            "earlier segment's proximal_t sits closer to prox_logp than the later one's, though it is one "
            "version older: as if every resume overwrote every token (seeds/001). Check that a resume "
            "updates only the tokens of the version just replaced",
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


def _loss_mask_edge(e: RunEvidence, _) -> Finding | None:
    if e.edges.is_empty():
        return None
    edges = e.edges.row(0, named=True)
    total, masked = int(e.cells["n"].sum() + e.cells["n_masked"].sum()), int(e.cells["n_masked"].sum())
    for edge in ("first", "last"):
        n, m = edges[f"n_{edge}"], edges[f"masked_{edge}"]
        others = (masked - m) / max(1, total - n)
        if n >= MIN_TOKENS and m >= EDGE_MASKED * n and others <= OTHER_MASKED:
            return Finding(
                "loss_mask_edge", e.run_id, "loss_mask", int(m),
                f"the {edge} token of {m / n:.0%} of {n:,} responses has loss_mask false, against "
                f"{others:.1%} of the other tokens: the fingerprint of a loss mask rolled by one position "
                f"(the {edge} token, often {'EOS' if edge == 'last' else 'the first answer token'}, never "
                "learned). Check the roll of loss_mask against the log-probs",
            )  # fmt: skip
    return None


def _version_count(e: RunEvidence, _) -> Finding | None:
    steps = e.cells.group_by("step").agg(pl.col("staleness").max())
    warm = int(steps["step"].min() + steps["staleness"].max())  # past the first max-staleness steps
    late = e.cells.filter(pl.col("step") > warm)
    rows = late["n"] + late["n_masked"]  # masked tokens count too: they were generated all the same
    if int(late["n"].sum()) < MIN_TOKENS or rows.filter(late["staleness"] == 0).sum() > 0:
        return None
    drift = e.drift_by_staleness()
    lowest = int(late["staleness"].min())
    if (
        lowest not in drift
        or lowest + 1 not in drift
        or min(drift[lowest][0], drift[lowest + 1][0]) < MIN_TOKENS
    ):
        return None
    low, step_up = drift[lowest][1], drift[lowest + 1][1] - drift[lowest][1]
    if step_up <= 0 or low >= FRESH_LIKE * step_up:
        return None
    return Finding(
        "version_count", e.run_id, "behave_version", int(late["n"].sum()),
        f"after step {warm} no token has staleness 0, yet the lowest staleness ({lowest}) drifts only "
        f"{low:.3g} nats from prox, less than half of one more version's increase ({step_up:.3g}): the "
        f"tokens labelled staleness {lowest} behave like fresh ones. Check that behave_version counts weight "
        "versions as step does (step s starts from version s): an off-by-one?",
    )  # fmt: skip


def _staleness_range(e: RunEvidence, max_staleness: int | None) -> Finding | None:
    by = e.cells.group_by("staleness").agg(pl.col("n").sum(), pl.col("step").min()).sort("staleness")
    if max_staleness is not None:
        beyond = by.filter(pl.col("staleness") > max_staleness)
        if beyond.is_empty():
            return None
        n = int(beyond["n"].sum())
        return Finding(
            "staleness_beyond_max", e.run_id, "behave_version", n,
            f"{n:,} tokens are staler than the configured maximum {max_staleness} (staleness up to "
            f"{beyond['staleness'].max()}, first at step {beyond['step'].min()}). Check that the trainer "
            "enforces its max_head_offpolicyness and counts versions as configured",
        )  # fmt: skip
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
        f"0..{usual} with no token between: a frozen version counter or tokens from another run. Check "
        "the version counter and the run_id of those tokens; give --max-staleness (the trainer's "
        "max_head_offpolicyness) to make tokens beyond it an error",
    )  # fmt: skip


def _engine_mismatch(e: RunEvidence, _) -> Finding | None:
    fresh = e.cells.filter(pl.col("staleness") == 0)
    n = int(fresh["n_prox"].sum())
    if n < MIN_TOKENS:
        return None
    prob, nemo = fresh["prob_drift"].sum() / n, fresh["exp_abs_drift"].sum() / n
    if prob <= VERL_PROBLEM:
        return None
    return Finding(
        "engine_mismatch", e.run_id, "behave_logp", n,
        f"at staleness 0 (one version: only the inference engine differs from the trainer) the mean "
        f"|exp(prox) - exp(behave)| is {prob:.3g} (verl calls above {VERL_PROBLEM} a precision problem) and "
        f"the mean exp|prox - behave| {nemo:.4g} (NeMo-RL flags above {NEMO_FLAG}), over {n:,} tokens. "
        "Check the engine's precision, kernels and sampling settings (temperature, top-p) against the "
        "trainer's",
    )  # fmt: skip


RULES = (
    _theta_at_minibatch_0,
    _incomplete_steps,
    _exact_source,
    _proximal_t,
    _loss_mask_edge,
    _version_count,
    _staleness_range,
    _engine_mismatch,
    prox_logp_zero,
    no_ground_truth,
)


EXPLAINS = {"behave_is_prox": {"proximal_t_misplaced"}, "prox_logp_zero": {"engine_mismatch"}}
"""A finding that explains another's signal: behave_logp equal to prox_logp puts every proximal_t
farther from prox than behave; a prox_logp of zeros is all drift at staleness 0. One cause, one finding."""


def run_findings(evidence: Evidence, max_staleness: int | None = None) -> list[Finding]:
    """Every finding of every run in the (pooled) evidence."""
    names = ("cells", "proximal_t", "segment_pairs", "edges")
    frames = {name: pl.from_arrow(getattr(evidence, name)) for name in names}
    found = []
    for run_id in sorted(frames["cells"]["run_id"].unique()):
        run = RunEvidence(run_id, *(f.filter(pl.col("run_id") == run_id) for f in frames.values()))
        run_found = [f for rule in RULES if (f := rule(run, max_staleness)) is not None]
        explained = set().union(*(EXPLAINS.get(f.rule, set()) for f in run_found))
        found += [f for f in run_found if f.rule not in explained]
    return found
