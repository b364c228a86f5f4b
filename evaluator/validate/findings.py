"""Data-driven findings: what silently breaks training and leaves a clear signal in the data, judged per
run on the evidence of all the files of one call (`evaluator.validate.evidence`, added up).

The checks go column by column, from what each column must satisfy in a correct asynchronous
decoupled-PPO run (`docs/validate.md` has the table): the minibatches of a step (`check_minibatch`),
behave_logp (`check_logp`), versions and steps over time (`check_versions`), proximal_t
(`check_proximal_t`), loss_mask (`check_mask`), advantage and reward (`check_advantage`). Each check
gives one verdict per run: a finding, passed, or undecided with why (a column absent, one minibatch, too
few tokens). Severity **error**: the data cannot be right (the run's files fail validation and replay
skips them); **warning**: very likely wrong, but a sane trainer could produce it (reported, stored with
the run, exit code 0). The thresholds live beside their checks, each with why.
"""

from __future__ import annotations

from evaluator.problems import CheckOutcome, Finding
from evaluator.validate import (
    check_advantage,
    check_logp,
    check_mask,
    check_minibatch,
    check_proximal_t,
    check_repeats,
    check_values,
    check_versions,
    no_truth,
    zero_prox,
)
from evaluator.validate.evidence import Evidence, split_runs
from evaluator.validate.verdicts import Check, Undecided

CHECKS = (
    Check(
        "minibatches_recorded",
        ("incomplete_step", "n_minibatches_varies"),
        check_minibatch.minibatches_recorded,
    ),
    Check("theta_at_minibatch_0", ("theta_not_prox_at_minibatch_0",), check_minibatch.theta_at_minibatch_0),
    Check("theta_moves", ("theta_equals_prox", "theta_gap_order"), check_minibatch.theta_moves),
    Check(
        "prox_fixed", ("prox_differs_across_minibatches", "prox_moves_with_theta"), check_minibatch.prox_fixed
    ),
    Check(
        "repeated_responses",
        (
            "token_id_differs_across_minibatches",
            "behave_differs_across_minibatches",
            "advantage_differs_across_minibatches",
            "reward_differs_across_minibatches",
        ),
        check_repeats.repeated,
    ),
    Check("ground_truth", ("no_ground_truth",), no_truth.no_ground_truth),
    Check("prox_logp_zero", ("prox_logp_zero",), zero_prox.prox_logp_zero),
    Check("logp_sentinel", ("logp_sentinel",), check_values.sentinel),
    Check("logp_placeholder", ("logp_placeholder",), check_values.placeholder),
    Check("logp_precision", ("logp_low_precision",), check_values.precision),
    Check("logp_per_token", ("logp_per_sequence",), check_values.per_token),
    Check(
        "column_coverage", ("prox_logp_partial", "advantage_partial", "reward_partial"), check_values.coverage
    ),
    Check("token_id_range", ("token_id_negative", "token_id_constant"), check_values.token_ids),
    Check(
        "behave_source", ("behave_is_prox", "behave_is_theta", "behave_mixed_source"), check_logp.exact_source
    ),
    Check("behave_placeholder", ("behave_placeholder",), check_logp.placeholder),
    Check("behave_sampled", ("behave_below_prox",), check_logp.sampled),
    Check("engine_mismatch", ("engine_mismatch",), check_logp.engine_mismatch),
    Check("engine_weights", ("drift_follows_step",), check_versions.weights_loaded),
    Check("version_count", ("version_count",), check_versions.version_count),
    Check("version_stalled", ("version_stalled",), check_versions.version_stalled),
    Check("version_rate", ("versions_slower_than_steps",), check_versions.version_rate),
    Check("staleness_range", ("staleness_beyond_max", "staleness_gap"), check_versions.staleness_range),
    Check("drift_growth", ("drift_not_growing",), check_versions.drift_growth),
    Check(
        "proximal_t_refresh",
        ("proximal_t_not_updated", "proximal_t_partial_update"),
        check_proximal_t.refresh,
    ),
    Check(
        "proximal_t_values",
        ("proximal_t_is_prox", "proximal_t_misplaced", "proximal_t_wrong_version"),
        check_proximal_t.values,
    ),
    Check("proximal_t_last_segment", ("proximal_t_last_segment",), check_proximal_t.last_segment),
    Check("loss_mask_trained", ("loss_mask_empty",), check_mask.trained),
    Check("loss_mask_edges", ("loss_mask_edge",), check_mask.edges),
    Check("loss_mask_truncated", ("loss_mask_truncated",), check_mask.truncated),
    Check("loss_mask_fragmented", ("loss_mask_fragmented",), check_mask.fragmented),
    Check("loss_mask_movement", ("loss_mask_movement",), check_mask.movement),
    Check(
        "advantage_over_response", ("advantage_varies", "advantage_misaligned"), check_advantage.over_response
    ),
    Check("advantage_alignment", ("advantage_misaligned",), check_advantage.alignment),
    Check("advantage_centred", ("advantage_not_centred",), check_advantage.centred),
    Check(
        "advantage_reward",
        ("advantage_against_reward", "advantage_ignores_reward", "reward_constant"),
        check_advantage.against_reward,
    ),
    Check("advantage_movement", ("advantage_against_movement",), check_advantage.against_movement),
    Check("reward_over_response", ("reward_varies",), check_advantage.reward_over_response),
)  # fmt: skip
"""Every check, in the order of the report."""

DRIFT_READERS = frozenset(
    {
        "prox_moves_with_theta",
        "drift_not_growing",
        "engine_mismatch",
        "version_count",
        "proximal_t_misplaced",
        "proximal_t_wrong_version",
        "behave_below_prox",
        "drift_follows_step",
    }
)
"""The findings read from |prox - behave| (the drift)."""
THETA_READERS = frozenset(
    {"theta_not_prox_at_minibatch_0", "theta_equals_prox", "theta_gap_order", "advantage_against_movement"}
)
"""The findings read from theta (its gap to prox, its movement)."""
PROXIMAL_T_REFRESH = frozenset({"proximal_t_not_updated", "proximal_t_partial_update"})
"""The findings read from proximal_t equal to behave bit for bit (a fill value in both is equal too)."""
EXPLAINS = {
    "logp_sentinel": DRIFT_READERS
    | THETA_READERS
    | {"loss_mask_movement", "proximal_t_last_segment"}
    | {"logp_placeholder"},
    "logp_per_sequence": DRIFT_READERS
    | THETA_READERS
    | {"loss_mask_movement", "proximal_t_last_segment"}
    | {"logp_placeholder"},
    "prox_logp_partial": DRIFT_READERS | THETA_READERS,
    "logp_placeholder": DRIFT_READERS | THETA_READERS | PROXIMAL_T_REFRESH,
    "prox_logp_zero": DRIFT_READERS | THETA_READERS - {"advantage_against_movement"} | {"logp_placeholder"},
    "behave_placeholder": DRIFT_READERS - {"behave_below_prox"} | {"proximal_t_last_segment"},
    "theta_not_prox_at_minibatch_0": {"theta_equals_prox", "theta_gap_order"},
    "behave_is_prox": {
        "proximal_t_misplaced",
        "proximal_t_last_segment",
        "drift_not_growing",
        "behave_mixed_source",
        "drift_follows_step",
    },
    "behave_is_theta": {
        "proximal_t_last_segment",
        "drift_not_growing",
        "behave_mixed_source",
        "drift_follows_step",
    },
    "proximal_t_not_updated": {"proximal_t_wrong_version"},
    "proximal_t_partial_update": {"proximal_t_wrong_version"},
    "advantage_against_reward": {"advantage_against_movement"},
    "prox_moves_with_theta": {"engine_mismatch"},
    "prox_differs_across_minibatches": {"engine_mismatch"},
    "drift_not_growing": {"engine_mismatch", "version_count"},
    "drift_follows_step": {"engine_mismatch", "drift_not_growing", "version_count"},
    "version_stalled": {
        "drift_not_growing",
        "engine_mismatch",
        "version_count",
        "versions_slower_than_steps",
    },
    "versions_slower_than_steps": {"drift_not_growing", "engine_mismatch", "version_count"},
    "loss_mask_movement": {"advantage_not_centred"},
    "advantage_ignores_reward": {"advantage_not_centred"},
    "reward_varies": {"reward_constant", "advantage_ignores_reward", "advantage_against_reward"},
}
"""A finding that explains another's signal, one cause, one finding: placeholder log-probs (-9999) or a
sequence's value on every token make every drift and theta figure meaningless, and a prox_logp on part of
a response is likely misplaced; a prox_logp of zeros is all drift (and theta equal to it); placeholder
behave log-probs (0) put a nonsense drift into every check that reads |prox - behave|; advantages that do
not belong to their responses are not centred in their groups either; minibatch indices out of the update
order put theta's start (equal to prox) at a later index; behave_logp taken from prox (or theta) puts every
proximal_t farther from prox than behave, the last segment's proximal_t (the engine's generation log-prob)
apart from behave, no drift at any staleness and equalities on every token (not some); an engine on old
weights puts drift of moved weights at staleness 0 and none between the versions; a proximal_t left
(wholly or partly) at behave_logp is as far from prox as behave; an advantage of the wrong sign moves the
policy against the one logged; a prox that follows theta or changes between minibatches, or versions that
do not count the updates (a stalled counter among them), put drift of moved weights at staleness 0; the
advantages of a response none of whose tokens is trained are read from its masked tokens; a reward that
varies over a response is read as its lowest value."""


def run_findings(
    evidence: Evidence, max_staleness: int | None = None
) -> tuple[list[Finding], list[CheckOutcome]]:
    """Every finding of every run in the (pooled) evidence, and every check's outcome per run."""
    found, outcomes = [], []
    for run in split_runs(evidence):
        verdicts = [(check, check.judge(run, max_staleness)) for check in CHECKS]
        run_found = [v for _, v in verdicts if isinstance(v, Finding)]
        explained = set().union(*(EXPLAINS.get(f.rule, set()) for f in run_found))
        found += [f for f in run_found if f.rule not in explained]
        for check, verdict in verdicts:
            if isinstance(verdict, Finding):
                status, why = (
                    ("passed", "explained by another finding")
                    if verdict.rule in explained
                    else ("found", verdict.rule)
                )
            elif isinstance(verdict, Undecided):
                status, why = "undecided", verdict.why
            else:
                status, why = "passed", ""
            outcomes.append(CheckOutcome(check.name, run.run_id, status, why))
    return found, outcomes
