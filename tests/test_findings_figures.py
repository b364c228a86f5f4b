"""The figures of the findings mined from the trainers' bugs, against the same figure computed with numpy
over the token log itself (not from the evidence the validator keeps); and the checks saying why when the
data cannot decide them."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_findings import found
from tests.zoo.bases import base
from tests.zoo.edits import chosen, col, from_end, put
from tests.zoo.kinds_bookkeeping import _step_per_rollout
from tests.zoo.kinds_logp import _behave_bf16, _behave_clamped, _raw_logprobs, _sentinel


def _finding(validation, rule):
    (finding,) = [f for f in validation.findings if f.rule == rule]
    return finding


def test_behave_below_prox_is_the_mean_gap_at_staleness_0(tmp_path):
    table = _raw_logprobs(base("synthetic"))
    finding = _finding(found(table, tmp_path, files=2), "behave_below_prox")
    b, p = col(table, "behave_logp").astype(float), col(table, "prox_logp").astype(float)
    fresh = col(table, "loss_mask") & (col(table, "step") == col(table, "behave_version")) & ~np.isnan(p)
    assert finding.figure == pytest.approx(np.mean(b[fresh] - p[fresh]), rel=1e-6)
    assert finding.rows == fresh.sum()


def test_logp_low_precision_is_the_share_on_the_float16_grid(tmp_path):
    table = _behave_bf16(base("smollm2"))
    finding = _finding(found(table, tmp_path, files=2), "logp_low_precision")
    b = col(table, "behave_logp").astype(np.float32)
    graded = b[b < -0.01]
    on_grid = (graded.view(np.uint32) & 0x1FFF) == 0
    assert (finding.column, finding.figure) == ("behave_logp", pytest.approx(on_grid.mean()))


def test_logp_sentinel_counts_the_trained_tokens_below_minus_1000(tmp_path):
    table = _sentinel(base("synthetic"))
    finding = _finding(found(table, tmp_path, files=2), "logp_sentinel")
    expected = (col(table, "loss_mask") & (col(table, "behave_logp") < -1000)).sum()
    assert finding.rows == expected > 0 and finding.figure == expected
    assert all(
        col(table, "behave_logp")[(col(table, "seq_id") == e["seq_id"]) & (col(table, "pos") == e["pos"])][0]
        < -1000
        for e in finding.examples
    )


def test_logp_placeholder_holds_the_clamp_value_and_its_share(tmp_path):
    table = _behave_clamped(base("toy"))
    finding = _finding(found(table, tmp_path, files=2), "logp_placeholder")
    b = col(table, "behave_logp").astype(float)
    graded = b[b < -0.01]
    assert finding.figure == pytest.approx(np.mean(graded == -3.0))
    assert finding.rows == (graded == -3.0).sum()


def test_versions_slower_than_steps_is_the_slope_of_the_freshest_version(tmp_path):
    table = _step_per_rollout(base("toy"))
    finding = _finding(found(table, tmp_path, files=2), "versions_slower_than_steps")
    step, version = col(table, "step"), col(table, "behave_version")
    steps = np.unique(step)
    freshest = [version[step == s].max() for s in steps]
    assert finding.figure == pytest.approx(np.polyfit(steps, freshest, 1)[0])


def test_the_new_checks_say_why_they_cannot_decide(tmp_path):
    """A short log of one minibatch a step, without token ids or rewards: each check that cannot decide
    on it says so."""
    table = base("synthetic").drop_columns(["token_id", "reward"])
    table = table.filter(np.isin(col(table, "step"), np.unique(col(table, "step"))[:6]))
    table = put(
        table,
        minibatch=np.zeros(table.num_rows, dtype=np.int32),
        n_minibatches=np.ones(table.num_rows, dtype=np.int32),
    )
    validation = found(table, tmp_path, files=1)
    why = {c.check: c.why for c in validation.checks if c.status == "undecided"}
    assert why["token_id_range"] == "no token_id column"
    assert why["repeated_responses"] == "no response is recorded in two minibatches of its step"
    assert why["version_rate"].startswith("6 steps")
    assert why["engine_weights"].startswith("6 steps with prox_logp, fewer than 8")


@pytest.mark.parametrize("column", ["advantage", "reward"])
def test_a_column_on_part_of_a_response_is_found(tmp_path, column):
    """advantage (reward) null on the last two trained tokens of 30% of responses: the share of responses
    with the column on some trained tokens that lack it on others."""
    table = base("synthetic")
    cut = chosen(table, 0.3, 15) & (from_end(table) < 2)
    table = put(table, **{column: np.where(cut, np.nan, col(table, column))})
    finding = _finding(found(table, tmp_path, files=2), f"{column}_partial")
    seq, mb, loss = col(table, "seq_id"), col(table, "minibatch"), col(table, "loss_mask")
    has = ~np.isnan(col(table, column).astype(float))
    keys = seq * 10 + mb
    covered = {k for k in np.unique(keys[loss & has])}
    partial = {k for k in np.unique(keys[loss & ~has])} & covered
    assert finding.column == column and finding.figure == pytest.approx(len(partial) / len(covered))
