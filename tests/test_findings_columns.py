"""The column-by-column checks of the findings (docs/validate.md, 'What each column guarantees'): each bug,
planted in the reference trainer's logs or a synthetic log as a trainer or an adapter makes it, gives its
own finding with its evidence (figure, threshold, example tokens, what to check), and nothing else;
the clean log it starts from gives none. Checks the data cannot decide say so, with why."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pytest

from evaluator.problems import SEVERITY
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps
from tests.builders import roll_within_sequences, sequence_index, set_column
from tests.test_findings import _fixture_run, found

SPEC = SyntheticSpec(run_id="bug", tokens_per_step=1536, mean_length=24)
FAST = replace(SPEC, drift=0.3)  # a policy that moves within a step more than the noise


def col(table: pa.Table, name: str) -> np.ndarray:
    return table[name].to_numpy(zero_copy_only=False)


def _logit(logp: np.ndarray) -> np.ndarray:
    return logp - np.log(-np.expm1(np.minimum(logp, -1e-7)))


def _log_sigmoid(x: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -x)


# --- clean variants the bugs start from ---------------------------------------------------------------


def token_level(t: pa.Table) -> pa.Table:
    """Token-level advantages (a critic's, or process rewards): each token its own, and the updates of
    the step move each trained token with its own advantage."""
    rng = np.random.default_rng(5)
    a = col(t, "advantage") + rng.normal(0.0, 1.0, t.num_rows)
    place = col(t, "minibatch") / col(t, "n_minibatches")
    theta = _log_sigmoid(_logit(col(t, "theta_logp")) + 0.5 * a * place * col(t, "loss_mask"))
    return set_column(set_column(t, "advantage", a), "theta_logp", theta)


def ppo_epochs(t: pa.Table) -> pa.Table:
    """Two PPO epochs: every response recorded again in a later minibatch of its step, with the same
    prox_logp and a theta that moved on."""
    m = int(col(t, "n_minibatches")[0])
    again = set_column(t, "minibatch", col(t, "minibatch") + m)
    again = set_column(again, "theta_logp", _log_sigmoid(_logit(col(t, "theta_logp")) + 0.05))
    both = pa.concat_tables([t, again])
    return set_column(both, "n_minibatches", np.full(both.num_rows, 2 * m))


# --- the bugs -----------------------------------------------------------------------------------------


def _theta_is_prox_at_minibatch_1(t):
    """Updates every second minibatch (the micro-batch index recorded as the minibatch)."""
    return set_column(
        t, "theta_logp", np.where(col(t, "minibatch") == 1, col(t, "prox_logp"), col(t, "theta_logp"))
    )


def _minibatches_swapped(t):
    """Minibatch 1 and 3 recorded under each other's index (the data order, not the update order)."""
    m = col(t, "minibatch")
    return set_column(t, "minibatch", np.where(m == 1, 3, np.where(m == 3, 1, m)))


def _prox_per_minibatch(t):
    """prox recomputed before every minibatch (bf16 noise apart, theta itself)."""
    noise = np.random.default_rng(0).normal(0.0, 0.003, t.num_rows)
    prox = np.where(np.isnan(col(t, "prox_logp")), np.nan, np.minimum(col(t, "theta_logp") + noise, 0.0))
    return set_column(t, "prox_logp", prox)


def _prox_recomputed_in_epoch_2(t):
    t = ppo_epochs(t)
    noise = np.random.default_rng(1).normal(0.0, 0.05, t.num_rows) * (col(t, "minibatch") >= 4)
    return set_column(t, "prox_logp", np.minimum(col(t, "prox_logp") + noise, 0.0))


def _behave_placeholders(t):
    """Tool-output tokens in the loss: the engine generated none of them, its log-prob is a 0 placeholder."""
    return set_column(t, "behave_logp", np.where(col(t, "pos") % 5 == 4, 0.0, col(t, "behave_logp")))


def _n_minibatches_doubled(t):
    return set_column(t, "n_minibatches", np.where(col(t, "minibatch") >= 2, 8, col(t, "n_minibatches")))


def _followed(t):
    return col(t, "proximal_t_version") == col(t, "behave_version") + 1


def _proximal_t_prefix_cached(t):
    """A resume that recomputed every third token of the earlier segments only."""
    kept = _followed(t) & (col(t, "pos") % 3 == 0)
    return set_column(t, "proximal_t_logp", np.where(kept, col(t, "behave_logp"), col(t, "proximal_t_logp")))


def _proximal_t_from_the_recompute(t):
    """The adapter fills proximal_t of the resumed tokens with the trainer's prox_logp."""
    followed, prox = _followed(t), col(t, "prox_logp")
    return set_column(
        t, "proximal_t_logp", np.where(followed & ~np.isnan(prox), prox, col(t, "proximal_t_logp"))
    )


def _mask_all_false(t):
    return set_column(t, "loss_mask", np.zeros(t.num_rows, bool))


def _last_segment_from_theta(t):
    last = col(t, "proximal_t_version") == col(t, "behave_version")
    return set_column(t, "proximal_t_logp", np.where(last, col(t, "theta_logp"), col(t, "proximal_t_logp")))


def _mask_cut(t):
    return set_column(t, "loss_mask", col(t, "loss_mask") & (col(t, "pos") <= 15))


def _mask_alternating(t):
    return set_column(t, "loss_mask", col(t, "pos") % 2 == 0)


def _mask_inverted(t):
    return set_column(t, "loss_mask", ~col(t, "loss_mask"))


def _counter_frozen(t):
    """The engine's version counter stuck at 19 from step 20 on (proximal_t left out: no resume)."""
    t = t.drop_columns(["proximal_t_logp", "proximal_t_version"])
    stuck = np.where(col(t, "step") >= 20, np.minimum(col(t, "behave_version"), 19), col(t, "behave_version"))
    return set_column(t, "behave_version", stuck)


def _versions_shuffled(t):
    """The stale responses' versions gathered in another order than the responses (the fresh ones, at
    staleness 0, in order): a stale response carries another's version."""
    t = t.drop_columns(["proximal_t_logp", "proximal_t_version"])
    group, starts, _ = sequence_index(t)
    step, version = col(t, "step")[starts], col(t, "behave_version")[starts]
    stale = np.flatnonzero(version < step)
    shuffled = version.copy()
    for s in np.unique(step[stale]):  # within each step
        chosen = stale[step[stale] == s]
        shuffled[chosen] = np.random.default_rng(int(s)).permutation(version[chosen])
    return set_column(t, "behave_version", shuffled[group])


def _advantage_bleeds(t):
    """Every 5th response's first 3 tokens carry the previous response's advantage (a packing bug)."""
    a = col(t, "advantage")
    group, starts, _ = sequence_index(t)
    previous = np.r_[a[0], a[starts[:-1]]][group]
    picked = (np.arange(len(starts)) % 5 == 0)[group] & (col(t, "pos") < 3)
    return set_column(t, "advantage", np.where(picked, previous, a))


def _advantage_rolled_flat(t):
    """The per-token advantages rolled by one over the whole batch: each response's first token takes the
    previous response's advantage."""
    a = col(t, "advantage")
    return set_column(t, "advantage", np.r_[a[:1], a[:-1]])


def _advantage_rolled_within(t):
    return roll_within_sequences(t, "advantage", 1)


def _advantage_is_reward(t):
    return set_column(t, "advantage", col(t, "reward"))


def _advantage_negated(t):
    return set_column(t, "advantage", -col(t, "advantage"))


def _advantages_shuffled(t):
    """Each response gets the advantage of a random response of the batch."""
    group, starts, _ = sequence_index(t)
    shuffled = np.random.default_rng(2).permutation(col(t, "advantage")[starts])
    return set_column(t, "advantage", shuffled[group])


def _policy_moves_against(t):
    """The loss's sign flipped: the updates move the policy against the advantage (theta's logit reflected
    about prox's after minibatch 0)."""
    prox, theta = col(t, "prox_logp"), col(t, "theta_logp")
    moved = (col(t, "minibatch") > 0) & ~np.isnan(prox)
    reflected = _log_sigmoid(2 * _logit(np.nan_to_num(prox, nan=-1.0)) - _logit(theta))
    return set_column(t, "theta_logp", np.where(moved, reflected, theta))


def _reward_on_last_token(t):
    _, starts, lengths = sequence_index(t)
    last = np.zeros(t.num_rows, bool)
    last[starts + lengths - 1] = True
    return set_column(t, "reward", np.where(last, col(t, "reward"), 0.0))


@dataclass(frozen=True)
class Bug:
    column: str
    edit: Callable[[pa.Table], pa.Table] | None = None
    base: str = "synthetic"
    """`toy` (the tiny model's recompute run), `smollm2` (SmolLM2's), or a synthetic log."""
    spec: SyntheticSpec = SPEC
    first_step: int = 8
    n_steps: int = 6
    clean: Callable[[pa.Table], pa.Table] = staticmethod(lambda t: t)
    bug_spec: SyntheticSpec | None = None
    """A bug the synthetic generator plants (instead of `edit`)."""

    def tables(self) -> tuple[pa.Table, pa.Table]:
        """(the clean log, the log with the bug)."""
        if self.base == "synthetic":
            table = self.clean(synthetic_steps(self.spec, self.first_step, self.n_steps))
        else:
            table = _fixture_run({"toy": "toy/toy-recompute", "smollm2": "recompute"}[self.base])
        if self.bug_spec is not None:
            return table, synthetic_steps(self.bug_spec, self.first_step, self.n_steps)
        return table, self.edit(table)


BUGS = {
    "theta_equals_prox": Bug("theta_logp", _theta_is_prox_at_minibatch_1, "toy"),
    "theta_gap_order": Bug("minibatch", _minibatches_swapped, "toy"),
    "prox_moves_with_theta": Bug("prox_logp", _prox_per_minibatch, "toy"),
    "prox_differs_across_minibatches": Bug("prox_logp", _prox_recomputed_in_epoch_2, clean=ppo_epochs),
    "n_minibatches_varies": Bug("n_minibatches", _n_minibatches_doubled),
    "behave_placeholder": Bug("behave_logp", _behave_placeholders, "smollm2"),
    "proximal_t_partial_update": Bug("proximal_t_logp", _proximal_t_prefix_cached, "toy"),
    "proximal_t_partial_update:smollm2": Bug("proximal_t_logp", _proximal_t_prefix_cached, "smollm2"),
    "proximal_t_last_segment": Bug("proximal_t_logp", _last_segment_from_theta, "toy"),
    "proximal_t_is_prox": Bug("proximal_t_logp", _proximal_t_from_the_recompute, "smollm2"),
    "loss_mask_empty": Bug("loss_mask", _mask_all_false, "smollm2"),
    "loss_mask_truncated": Bug("loss_mask", _mask_cut),
    "loss_mask_truncated:smollm2": Bug("loss_mask", _mask_cut, "smollm2"),
    "loss_mask_fragmented": Bug("loss_mask", _mask_alternating),
    "loss_mask_movement": Bug("loss_mask", _mask_inverted),
    "version_count:weights_one_behind": Bug("behave_version", bug_spec=replace(SPEC, weights_offset=-1)),
    "version_stalled": Bug(
        "behave_version", _counter_frozen, spec=replace(FAST, max_staleness=3, tokens_per_step=768),
        first_step=0, n_steps=40,
    ),
    "drift_not_growing": Bug("behave_version", _versions_shuffled, spec=FAST, n_steps=12),
    "advantage_varies": Bug("advantage", _advantage_bleeds),
    "advantage_misaligned": Bug("advantage", _advantage_rolled_flat),
    "advantage_misaligned:token_level": Bug("advantage", _advantage_rolled_within, clean=token_level),
    "advantage_not_centred": Bug("advantage", _advantage_is_reward),
    "advantage_against_reward": Bug("advantage", _advantage_negated),
    "advantage_against_reward:smollm2": Bug("advantage", _advantage_negated, "smollm2"),
    "advantage_ignores_reward": Bug("advantage", _advantages_shuffled),
    "advantage_against_movement": Bug("advantage", _policy_moves_against, "toy"),
    "reward_varies": Bug("reward", _reward_on_last_token),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BUGS))
def test_each_column_bug_is_found_with_its_evidence(tmp_path, case):
    bug, rule = BUGS[case], case.split(":")[0]
    clean, broken = bug.tables()
    assert found(clean, tmp_path / "clean", files=2).findings == []
    validation = found(broken, tmp_path / "bug", files=2)
    assert [f.rule for f in validation.findings] == [rule]
    (finding,) = validation.findings
    assert (finding.column, finding.severity) == (bug.column, SEVERITY[rule])
    assert finding.rows > 0 and finding.figure is not None and finding.threshold and finding.advice
    assert 1 <= len(finding.examples) <= 3
    seq_ids = set(col(broken, "seq_id").tolist())
    assert all(e["seq_id"] in seq_ids and e["pos"] >= 0 for e in finding.examples)
    (outcome,) = [c for c in validation.checks if c.status == "found"]
    assert outcome.why == rule and outcome.run_id == finding.run_id
    if SEVERITY[rule] == "error":
        assert not any(r.ok for r in validation.reports)
    else:
        assert all(r.ok for r in validation.reports)


def test_a_sampled_file_keeps_its_groups_whole(tmp_path, monkeypatch):
    """A file over MAX_SAMPLE_ROWS is read on blocks of consecutive seq_ids: GRPO groups stay whole (no
    false finding), the bugs still show, and the file's notes say so."""
    from evaluator.validate import block_sample

    monkeypatch.setattr(block_sample, "MAX_SAMPLE_ROWS", 6000)
    table = synthetic_steps(replace(FAST, tokens_per_step=4096), 8, 8)  # 33k rows
    clean = found(table, tmp_path / "clean", files=1)
    assert clean.findings == [] and any("sample of whole blocks" in n for n in clean.reports[0].notes)
    assert "advantage_reward" not in {c.check for c in clean.checks if c.status == "undecided"}
    assert [f.rule for f in found(_advantage_negated(table), tmp_path / "bug", files=1).findings] == [
        "advantage_against_reward"
    ]
