"""The alignment audit (DOMAIN.md section 5): silent on correct logs, loud on columns shifted by one token."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from evaluator.logio import write_log_atomic
from evaluator.trainer.synthetic import synthetic_steps
from evaluator.validate import audit_sample, validate_file, validate_paths
from evaluator.validate.audit import ShiftFit, judge
from tests.builders import (
    FIRST_STEP,
    N_STEPS,
    SPEC,
    clean_table,
    roll_within_sequences,
    sequence_index,
    set_column,
)
from tests.conftest import FIXTURES

FIXTURE_FILES = sorted(FIXTURES.rglob("*.parquet"))  # SmolLM2 runs, and the tiny model's in toy/
needs_fixtures = pytest.mark.skipif(not FIXTURE_FILES, reason="fixtures/ has no parquet yet")
SEQUENCE_ORDER = [("seq_id", "ascending"), ("minibatch", "ascending"), ("pos", "ascending")]


def findings(table: pa.Table, tmp_path: Path, name: str = "log") -> list:
    report = validate_file(write_log_atomic(table, tmp_path / f"{name}.parquet"))
    return [p for p in report.problems if p.rule.startswith("misaligned")]


def notes(table: pa.Table, tmp_path: Path) -> list[str]:
    return validate_file(write_log_atomic(table, tmp_path / "log.parquet")).notes


@pytest.fixture(scope="module")
def table() -> pa.Table:
    return clean_table()


class TestCorrectLogsAreQuiet:
    def test_synthetic_with_staleness_up_to_8(self, table, tmp_path):
        staleness = pc.subtract(table["step"], pc.cast(table["behave_version"], pa.int64()))
        assert pc.max(staleness).as_py() == 8
        assert findings(table, tmp_path) == []
        text = " ".join(notes(table, tmp_path))
        assert "behave_logp vs prox_logp aligned" in text and "theta_logp vs prox_logp aligned" in text

    def test_only_stale_sequences_of_a_fast_moving_policy(self, tmp_path):
        fast = synthetic_steps(dataclasses.replace(SPEC, drift=0.4, max_staleness=8), FIRST_STEP, N_STEPS)
        group, starts, _ = sequence_index(fast)
        staleness = fast["step"].to_numpy() - fast["behave_version"].to_numpy()
        stale = (np.minimum.reduceat(staleness, starts) >= 4)[group]
        assert stale.sum() > 1000
        assert findings(fast.filter(pa.array(stale)), tmp_path) == []

    def test_near_deterministic_tokens_are_inconclusive_not_misaligned(self, table, tmp_path):
        confident = table
        for column in ("behave_logp", "prox_logp", "theta_logp", "proximal_t_logp"):
            confident = set_column(confident, column, pc.multiply(confident[column], 1e-3))
        assert findings(confident, tmp_path) == []
        assert any("behave_logp vs prox_logp inconclusive" in n for n in notes(confident, tmp_path))

    def test_no_prox_logp_is_inconclusive(self, tmp_path):
        log = synthetic_steps(dataclasses.replace(SPEC, prox_every=0), FIRST_STEP, N_STEPS)
        assert findings(log, tmp_path) == []
        assert any("no prox_logp" in n for n in notes(log, tmp_path))


class TestShiftedLogsAreCaught:
    @pytest.mark.parametrize("shift", [1, -1])
    @pytest.mark.parametrize("column", ["behave_logp", "theta_logp"])
    def test_rolled_logp_column(self, table, tmp_path, column, shift):
        (problem,) = findings(roll_within_sequences(table, column, shift), tmp_path)
        assert (problem.rule, problem.column) == ("misaligned_logp", column)
        assert f"better shifted by {shift:+d} token" in problem.message and "roll" in problem.message

    @pytest.mark.parametrize("shift", [1, -1])
    def test_rolled_behave_version(self, table, tmp_path, shift):
        found = findings(roll_within_sequences(table, "behave_version", shift), tmp_path)
        assert found and {p.rule for p in found} == {"misaligned_version"}
        assert all(f"shifted by {shift:+d}" in p.message for p in found)

    def test_roll_over_the_packed_batch(self, table, tmp_path):
        packed = set_column(table, "behave_logp", np.roll(table["behave_logp"].to_numpy(), 1))
        assert [p.column for p in findings(packed, tmp_path)] == ["behave_logp"]

    @pytest.mark.parametrize("shift", [1, -1])
    def test_rolled_prox_logp_is_named_as_such(self, table, tmp_path, shift):
        """behave_logp and theta_logp both fit prox_logp at the opposite shift: one finding, on prox_logp."""
        (problem,) = findings(roll_within_sequences(table, "prox_logp", shift), tmp_path)
        assert (problem.rule, problem.column) == ("misaligned_logp", "prox_logp")
        assert f"prox_logp fits behave_logp and theta_logp better shifted by {shift:+d}" in problem.message

    def test_large_files_are_sampled_and_say_so(self, table, tmp_path, monkeypatch):
        monkeypatch.setattr(audit_sample, "MAX_AUDIT_TOKENS", table.num_rows // 2)
        rolled = roll_within_sequences(table, "theta_logp", 1)
        report = validate_file(write_log_atomic(rolled, tmp_path / "big.parquet"))
        assert any("deterministic sample" in n for n in report.notes)
        assert [p.column for p in report.problems if p.rule == "misaligned_logp"] == ["theta_logp"]


class TestJudge:
    """The decision on hand-made statistics."""

    def fit(self, stat, wins=None, n=100, floor=0.1, ratio=1.5) -> ShiftFit:
        return ShiftFit(
            "behave_logp",
            "prox_logp",
            dict(zip((-1, 0, 1), stat, strict=True)),
            n,
            "mad",
            floor,
            ratio,
            wins=wins,
        )

    def test_clear_shift_is_a_finding(self):
        misaligned, message = judge(self.fit((1.1, 1.2, 0.003), wins={-1: 0.4, 0: 0.0, 1: 0.97}))
        assert misaligned and "shifted by +1 token" in message and "0.003 vs 1.2 at shift 0" in message

    def test_ratio_without_token_wins_is_not(self):
        assert not judge(self.fit((1.1, 1.2, 0.5), wins={-1: 0.4, 0: 0.0, 1: 0.55}))[0]

    def test_below_the_absolute_floor_is_not(self):
        assert not judge(self.fit((0.05, 0.05, 0.0001), wins={-1: 0.5, 0: 0.0, 1: 1.0}))[0]

    def test_too_few_tokens_is_inconclusive(self):
        misaligned, message = judge(self.fit((1.0, 1.2, 0.0), wins={-1: 0.5, 0: 0.0, 1: 1.0}, n=10))
        assert not misaligned and "inconclusive" in message

    def test_version_rates_need_the_large_ratio(self):
        assert judge(self.fit((0.5, 0.4, 0.0), floor=0.15, ratio=4.0))[0]
        assert not judge(self.fit((0.5, 0.4, 0.2), floor=0.15, ratio=4.0))[0]


@pytest.fixture(scope="module")
def runs() -> dict[str, pa.Table]:
    """Each fixture run, all its files in one table, grouped by sequence."""
    by_run: dict[str, list[pa.Table]] = {}
    for t in map(pq.read_table, FIXTURE_FILES):
        by_run.setdefault(t["run_id"][0].as_py(), []).append(t)
    return {run: pa.concat_tables(ts).sort_by(SEQUENCE_ORDER) for run, ts in by_run.items()}


@needs_fixtures
class TestRealFixtures:
    """Logs of the reference trainer (staleness 0-8, bf16 engine, abort-resume with proximal_t)."""

    @pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: p.name)
    def test_every_fixture_validates_clean(self, path):
        report = validate_file(path)
        assert report.problems == [], report.problems

    @pytest.mark.parametrize("column", ["behave_logp", "theta_logp", "behave_version"])
    def test_shifted_copy_of_a_run_is_caught(self, runs, tmp_path, column):
        for run, t in runs.items():
            found = findings(roll_within_sequences(t, column, 1), tmp_path, run)
            assert any(p.column == column and "shifted by +1" in p.message for p in found), (run, found)

    def test_theta_shift_is_caught_in_every_single_fixture_file(self, tmp_path):
        for path in FIXTURE_FILES:
            rolled = roll_within_sequences(pq.read_table(path).sort_by(SEQUENCE_ORDER), "theta_logp", -1)
            assert [p.column for p in findings(rolled, tmp_path)] == ["theta_logp"], path.name

    @pytest.mark.parametrize("column", ["behave_logp", "theta_logp"])
    def test_shifted_column_is_caught_on_every_file_of_a_run(self, tmp_path, column):
        """Every file rolled, validated in one call: files that alone are inconclusive are settled on the
        run's pooled evidence, so each file of the run reports the shift."""
        for path in FIXTURE_FILES:
            rolled = roll_within_sequences(pq.read_table(path).sort_by(SEQUENCE_ORDER), column, 1)
            write_log_atomic(rolled, tmp_path / path.name)
        reports = validate_paths([tmp_path]).reports
        missed = [r.path.name for r in reports if not any(p.column == column for p in r.problems)]
        assert missed == [] and len(reports) == len(FIXTURE_FILES)
