"""The gate (evaluator/gate/, its reports in evaluator/verdict/, `proxaudit gate`) on small stores built row
by row from known values: the statistic of a selection, the judge, the run selection, the reports and the
exit codes. `tests/test_gate_levels.py` judges each staleness; `tests/test_gate_fixtures.py` runs the same
gate on replayed real logs."""

from __future__ import annotations

import json
import math
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from click.testing import CliRunner

from evaluator.cli import cli
from evaluator.errors import StoreError, ThresholdsError, UsageError
from evaluator.formulas.loss import DEFAULT_LOSS
from evaluator.formulas.sketch import bucket_code, sketch_quantile
from evaluator.gate import DEFAULT_THRESHOLDS, run_gate
from evaluator.gate.rules import judge
from evaluator.store import StoreWriter, connect_store
from evaluator.store.figures import selection_stats as observed_stats
from evaluator.verdict import Judgement, judge_db
from evaluator.verdict.junit import render_junit
from evaluator.verdict.report import render_json, render_markdown, render_table
from schemas.figures import Observed
from schemas.store import STATS
from schemas.thresholds import parse_thresholds
from tests.reference import QUANTILE_PERCENT, promised_value, safe_staleness, within_promise


def build_store(path: Path, samples: dict[tuple[str, int, str, str], np.ndarray], steps: int = 0) -> Path:
    """A store holding exactly `samples[(run_id, staleness, method, metric)]`, each split over two files
    (so every statistic has to merge rows), with the tables `proxaudit replay` fills, the intervals too.
    Each staleness is its own step (10 + staleness), or with `steps`, every step (10..) holds every
    staleness's values in turn (as a trainer's steps do: the intervals of a bootstrap over steps are then
    those of evenly spread tokens)."""
    moments, sketches, tokens = [], [], {}
    for (run, staleness, method, metric), values in samples.items():
        values = np.asarray(values, np.float64)
        parts = (
            [(10 + staleness, values)] if not steps else [(10 + k, values[k::steps]) for k in range(steps)]
        )
        for step, in_step in parts:
            _add(in_step, run, step, staleness, method, metric, moments, sketches, tokens)
    with StoreWriter(path) as writer:  # the store's tables; on exit, the intervals of its runs
        writer.con.execute("BEGIN TRANSACTION")
        _insert(writer.con, moments, sketches, tokens)
        writer.con.execute("COMMIT")
    return path


def _add(values, run, step, staleness, method, metric, moments, sketches, tokens) -> None:
    """One step's values as the rows of two files."""
    for file_id, part in enumerate(np.array_split(values, 2), start=1):
        if len(part) == 0:
            continue
        moments.append((file_id, run, step, staleness, method, metric, len(part), *_moments(part)))
        buckets, counts = np.unique(bucket_code(part), return_counts=True)
        sketches += [
            (file_id, run, staleness, method, metric, int(b), int(c))
            for b, c in zip(buckets, counts, strict=True)
        ]
        key = (file_id, run, step, staleness)
        tokens[key] = max(tokens.get(key, 0), len(part))


def _insert(con, moments, sketches, tokens) -> None:
    tokens_rows = [(*key, n, n) for key, n in tokens.items()]
    for table, rows in (
        ("metric_moments", moments),
        ("sketch_by_staleness", sketches),
        ("file_tokens", tokens_rows),
    ):
        if rows:
            names = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
            frame = pa.table({name: [row[i] for row in rows] for i, name in enumerate(names)})  # noqa: F841
            con.execute(f"INSERT INTO {table} SELECT * FROM frame")


def _moments(part: np.ndarray) -> tuple[float, float, float, float]:
    return float(part.sum()), float(np.square(part).sum()), float(part.min()), float(part.max())


def lognormal(seed: int, n: int, mu: float = -5.0, sigma: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).lognormal(mu, sigma, n)


def store_samples() -> dict[tuple[str, int, str, str], np.ndarray]:
    """Runs `base` and `new`, loglinear abs_error at staleness 0..3 (error grows with staleness; `new` is
    worse), rollout abs_error for `base` only, and run `tiny` with 50 tokens."""
    samples = {}
    for s in range(4):
        samples["base", s, "loglinear", "abs_error"] = lognormal(s, 400 + 100 * s, mu=-6 + s)
        samples["new", s, "loglinear", "abs_error"] = lognormal(10 + s, 400 + 100 * s, mu=-5.5 + s)
        samples["base", s, "rollout", "abs_error"] = lognormal(20 + s, 300, mu=-3)
    samples["tiny", 0, "loglinear", "abs_error"] = lognormal(30, 50)
    return samples


@pytest.fixture(scope="module")
def store_made_once(tmp_path_factory) -> Path:
    return build_store(tmp_path_factory.mktemp("gate") / "metrics", store_samples())


@pytest.fixture
def store(store_made_once, tmp_path) -> Path:
    """`store_samples()`'s store, a copy of its own for each test (a store folder copies whole)."""
    return Path(shutil.copytree(store_made_once, tmp_path / "metrics"))


LOGLINEAR = '[[check]]\nmethod="loglinear"\nmetric="abs_error"\n'


def gate_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "gate.toml"
    path.write_text(body)
    return path


def check(body: str):
    (parsed,) = parse_thresholds("[[check]]\n" + body).checks
    return parsed


def stats(n=2000, **values) -> dict:
    return {"n": n, "mean": 0.01, "min": 0.0, "max": 1.0, "p50": 0.005, "p90": 0.02, "p99": 0.05} | values


def judged(check, run: str, values: dict | None, baseline: dict | None = None):
    """`judge` on the check's statistic of `values` (None: no token in the selection)."""

    def observed(stats: dict | None) -> Observed | None:
        return None if stats is None else Observed(stats[check.measure], n=stats["n"])

    return judge(check, run, observed(values), observed(baseline) if baseline is not None else None)


def selection_stats(con, method, metric, staleness=None) -> dict[str, dict[str, float]]:
    """The store's statistics of a selection as plain numbers (`evaluator.store.figures.selection_stats`)."""
    return {
        run: {stat: o.value for stat, o in found.items()}
        for run, found in observed_stats(con, method, metric, staleness).items()
    }


class TestSelectionStats:
    def test_full_range_and_one_staleness_equal_numpy_over_the_samples(self, store):
        """selection_stats and the views it must agree with (run_summary, staleness_summary), each against
        the statistics of the very values the store was built from."""
        samples, con = store_samples(), connect_store(store)
        for method in ("loglinear", "rollout"):
            mine = {k: v for k, v in samples.items() if k[2] == method}
            runs = sorted({run for run, *_ in mine})
            whole = {run: np.concatenate([v for k, v in mine.items() if k[0] == run]) for run in runs}
            view = con.execute(
                "SELECT * FROM run_summary WHERE method = ? AND metric = 'abs_error'", [method]
            ).fetchall()
            for got in (selection_stats(con, method, "abs_error"), _by_run(view, 3)):
                assert_stats_of(got, whole)
            for s in range(4):
                one = {run: v for (run, level, _, _), v in mine.items() if level == s}
                sql = "SELECT * FROM staleness_summary WHERE method = ? AND metric = ? AND staleness = ?"
                view = con.execute(sql, [method, "abs_error", s]).fetchall()
                for got in (selection_stats(con, method, "abs_error", (s, s)), _by_run(view, 4)):
                    assert_stats_of(got, one)

    def test_a_range_merges_the_sketches_like_one_sketch_of_all_its_tokens(self, store, tmp_path):
        values = np.concatenate([lognormal(10 + s, 400 + 100 * s, mu=-5.5 + s) for s in (1, 2)])
        con = connect_store(store)
        got = selection_stats(con, "loglinear", "abs_error", (1, 2))["new"]
        assert got["n"] == len(values) == 1100
        assert got["min"] == values.min() and got["max"] == values.max()
        assert math.isclose(got["mean"], values.mean(), rel_tol=1e-12)
        buckets, counts = np.unique(bucket_code(values), return_counts=True)
        for q, stat in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
            assert got[stat] == sketch_quantile(buckets, counts, q, values.min(), values.max())
            assert within_promise(got[stat], promised_value(values, stat))
        # not the token-weighted average of the per-staleness p99s (which is what a shortcut would give)
        per = [selection_stats(con, "loglinear", "abs_error", (s, s))["new"] for s in (1, 2)]
        averaged = (per[0]["p99"] * per[0]["n"] + per[1]["p99"] * per[1]["n"]) / got["n"]
        assert abs(averaged - got["p99"]) > 0.05 * got["p99"]

    def test_runs_without_tokens_in_the_range_are_absent(self, store):
        con = connect_store(store)
        assert set(selection_stats(con, "loglinear", "abs_error", (1, 3))) == {"base", "new"}
        assert selection_stats(con, "loglinear", "abs_error", (7, 9)) == {}
        assert set(selection_stats(con, "rollout", "abs_error")) == {"base"}


def _by_run(rows: list[tuple], first_stat: int) -> dict[str, dict]:
    """Rows of a summary view (run_id first, the statistics from column `first_stat`) by run."""
    return {row[0]: dict(zip(STATS, row[first_stat : first_stat + len(STATS)], strict=True)) for row in rows}


def assert_stats_of(got: dict, values: dict[str, np.ndarray]) -> None:
    """`got` (run -> statistics) holds n, mean, min and max of each run's values exactly (the mean to
    rounding), and quantiles within the sketch's promise of the values at the exact ranks."""
    assert set(got) == set(values) and values
    for run, v in values.items():
        assert got[run]["n"] == len(v)
        assert (got[run]["min"], got[run]["max"]) == (v.min(), v.max())
        assert math.isclose(got[run]["mean"], v.mean(), rel_tol=1e-12), run
        for stat in QUANTILE_PERCENT:
            assert within_promise(got[run][stat], promised_value(v, stat)), (run, stat)


class TestJudge:
    def test_max_passes_at_the_limit_and_fails_above_it(self):
        at = judged(
            check('method="loglinear"\nmetric="abs_error"\nstat="p99"\nmax=0.05'), "r", stats(p99=0.05)
        )
        assert (at.verdict, at.outcome, at.value, at.tokens) == ("pass", "ok", 0.05, 2000)
        above = judged(
            check('method="loglinear"\nmetric="abs_error"\nstat="p99"\nmax=0.05'), "r", stats(p99=0.06)
        )
        assert (above.verdict, above.outcome) == ("fail", "threshold")
        assert "p99 0.06 > max 0.05" in above.reason

    def test_min_and_a_band(self):
        band = check('method="loglinear"\nmetric="behave_imp_weight"\nstat="mean"\nmin=0.9\nmax=1.1')
        assert judged(band, "r", stats(mean=1.0)).verdict == "pass"
        assert judged(band, "r", stats(mean=0.8)).reason == "mean 0.8 < min 0.9"
        assert judged(band, "r", stats(mean=1.2)).verdict == "fail"

    def test_nan_never_passes(self):
        c = check('method="loglinear"\nmetric="importance_weight"\nstat="max"\nmax=5')
        assert judged(c, "r", stats(max=float("nan"))).verdict == "fail"

    def test_insufficient_data_fails_or_warns_as_configured(self):
        c = check('method="loglinear"\nmetric="abs_error"\nstat="mean"\nmax=1\nmin_tokens=1000')
        verdict = judged(c, "r", stats(n=999))
        assert (verdict.verdict, verdict.outcome, verdict.tokens) == ("fail", "insufficient_data", 999)
        assert judged(c, "r", stats(n=1000)).verdict == "pass"
        assert judged(c, "r", None).outcome == "insufficient_data"  # no token in the selection at all
        warn = check(
            'method="loglinear"\nmetric="abs_error"\nstat="mean"\nmax=1\nmin_tokens=1000\non_insufficient="warn"'
        )
        assert judged(warn, "r", stats(n=10)).verdict == "warn"
        assert (
            judged(
                check('method="loglinear"\nmetric="abs_error"\nstat="n"\nmin=0\nmin_tokens=0'), "r", None
            ).verdict
            == "fail"
        )

    def test_warn_only_turns_failures_into_warnings(self):
        c = check(
            'method="loglinear"\nmetric="abs_error"\nstat="p99"\nmax=0.05\nwarn_only=true\nmin_tokens=10'
        )
        assert judged(c, "r", stats(p99=0.5)).verdict == "warn"
        assert judged(c, "r", stats(n=3)).verdict == "warn"
        assert judged(c, "r", stats(p99=0.01)).verdict == "pass"

    def test_regression_lower_is_better(self):
        c = check('method="loglinear"\nmetric="abs_error"\nstat="mean"\nbaseline_run="b"\nmax_regression=0.1')
        ok = judged(c, "r", stats(mean=0.0109), stats(mean=0.01))
        assert (ok.verdict, ok.baseline.value, ok.regression_limit) == ("pass", 0.01, pytest.approx(0.011))
        worse = judged(c, "r", stats(mean=0.0111), stats(mean=0.01))
        assert (worse.verdict, worse.outcome) == ("fail", "regression")
        assert "0.0111 > 0.011 (baseline 0.01 +10%)" in worse.reason
        assert judged(c, "r", stats(mean=0.001), stats(mean=0.01)).verdict == "pass"  # better is fine

    def test_regression_higher_is_better_when_only_min_is_set(self):
        c = check(
            'method="loglinear"\nmetric="abs_error"\nstat="n"\nmin=1\nbaseline_run="b"\nmax_regression=0.1'
        )
        assert c.better == "higher"
        assert judged(c, "r", stats(n=1800), stats(n=2000)).verdict == "pass"
        assert judged(c, "r", stats(n=1700), stats(n=2000)).outcome == "regression"

    def test_regression_of_a_negative_statistic_moves_away_from_zero(self):
        c = check(
            'method="loglinear"\nmetric="approx_logp"\nstat="mean"\nbaseline_run="b"\nmax_regression=0.5'
        )
        assert judged(c, "r", stats(mean=-2.9), stats(mean=-2.0)).verdict == "pass"  # limit -1.0
        assert judged(c, "r", stats(mean=-0.9), stats(mean=-2.0)).verdict == "fail"

    def test_absolute_and_regression_failures_are_both_reported(self):
        c = check(
            'method="loglinear"\nmetric="abs_error"\nstat="mean"\nmax=0.01\nbaseline_run="b"\nmax_regression=0'
        )
        verdict = judged(c, "r", stats(mean=0.02), stats(mean=0.01))
        assert (
            verdict.outcome == "threshold"
            and "max 0.01" in verdict.reason
            and "baseline 0.01" in verdict.reason
        )

    def test_baseline_with_too_few_tokens_is_insufficient(self):
        c = check(
            'method="loglinear"\nmetric="abs_error"\nstat="mean"\nbaseline_run="b"\nmax_regression=0.1\nmin_tokens=100'
        )
        verdict = judged(c, "r", stats(), stats(n=5))
        assert (verdict.verdict, verdict.outcome) == (
            "fail",
            "insufficient_data",
        ) and "baseline" in verdict.reason
        assert judged(c, "r", stats(), None).outcome == "insufficient_data"


class TestEvaluate:
    def test_every_run_by_default_one_verdict_each(self, store, tmp_path):
        body = '[[check]]\nmethod="loglinear"\nmetric="abs_error"\nstat="n"\nmin=1000\n'
        result = run_gate(store, gate_file(tmp_path, body))
        assert [(v.run_id, v.verdict, v.tokens) for v in result.verdicts] == [
            ("base", "pass", 2200), ("new", "pass", 2200), ("tiny", "fail", 50)
        ]  # fmt: skip
        assert result.exit_code == 1

    def test_a_metric_the_run_lacks_is_a_failing_missing_metric(self, store, tmp_path):
        body = (
            '[[check]]\nmethod="rollout"\nmetric="abs_error"\nstat="mean"\nmax=100\non_insufficient="warn"\n'
        )
        result = run_gate(store, gate_file(tmp_path, body))
        outcomes = {v.run_id: (v.verdict, v.outcome) for v in result.verdicts}
        assert outcomes == {
            "base": ("pass", "ok"), "new": ("fail", "missing_metric"), "tiny": ("fail", "missing_metric")
        }  # fmt: skip
        proximal_t = '[[check]]\nmethod="proximal_t"\nmetric="abs_error"\nstat="mean"\nmax=100\nrun="base"\n'
        assert run_gate(store, gate_file(tmp_path, proximal_t)).verdicts[0].outcome == "missing_metric"

    def test_an_empty_staleness_range_is_insufficient_data(self, store, tmp_path):
        body = LOGLINEAR + 'stat="mean"\nmax=1\nstaleness=[5,8]\nrun="new"\n'
        (verdict,) = run_gate(store, gate_file(tmp_path, body)).verdicts
        assert (verdict.verdict, verdict.outcome, verdict.tokens) == ("fail", "insufficient_data", 0)

    def test_a_run_not_in_the_database_fails(self, store, tmp_path):
        body = '[[check]]\nmethod="loglinear"\nmetric="abs_error"\nstat="mean"\nmax=1\nrun="nope"\n'
        (verdict,) = run_gate(store, gate_file(tmp_path, body)).verdicts
        assert (verdict.verdict, verdict.outcome) == (
            "fail",
            "missing_run",
        ) and "base, new, tiny" in verdict.reason

    def test_run_option_naming_no_run_is_one_usage_error(self, store, tmp_path):
        """`--run` with a run the store lacks is a mistyped option (exit 2, naming the runs), not a failed
        verdict for every check (the pinned `run = "nope"` of a thresholds file above stays a verdict)."""
        with pytest.raises(UsageError, match="no run 'nope' in .*; runs: base, new, tiny"):
            run_gate(store, DEFAULT_THRESHOLDS, run="nope")
        json_path = tmp_path / "gate.json"
        result = CliRunner().invoke(
            cli, ["gate", "--db", str(store), "--run", "nope", "--json", str(json_path)]
        )
        assert result.exit_code == 2, result.output
        assert result.output.splitlines() == [
            f"proxaudit: error: no run 'nope' in {store}; runs: base, new, tiny"
        ]
        assert not json_path.exists()  # no report of verdicts that judged nothing

    def test_an_empty_database_fails_every_check(self, tmp_path):
        empty = build_store(tmp_path / "empty", {})
        body = '[[check]]\nmethod="loglinear"\nmetric="abs_error"\nstat="mean"\nmax=1\n'
        (verdict,) = run_gate(empty, gate_file(tmp_path, body)).verdicts
        assert (verdict.run_id, verdict.verdict, verdict.outcome) == (None, "fail", "missing_run")

    def test_run_option_selects_one_run_and_skips_checks_pinned_to_another(self, store, tmp_path):
        body = (
            '[[check]]\nmethod="loglinear"\nmetric="abs_error"\nstat="n"\nmin=1000\n'
            '[[check]]\nmethod="loglinear"\nmetric="abs_error"\nstat="n"\nmin=1000\nrun="tiny"\n'
        )
        result = run_gate(store, gate_file(tmp_path, body), run="base")
        assert [(v.run_id, v.verdict, v.outcome) for v in result.verdicts] == [
            ("base", "pass", "ok"), ("tiny", "skip", "not_selected")
        ]  # fmt: skip
        assert result.exit_code == 0

    def test_baseline_is_not_judged_against_itself(self, store, tmp_path):
        body = LOGLINEAR + 'stat="p90"\nbaseline_run="base"\nmax_regression=0.1\n'
        result = run_gate(store, gate_file(tmp_path, body))
        # base p90 0.101 (limit 0.111); new p90 0.155 is worse, tiny p90 0.027 better
        outcomes = {v.run_id: (v.verdict, v.outcome) for v in result.verdicts}
        assert outcomes == {"new": ("fail", "regression"), "tiny": ("pass", "ok")}
        generous = body.replace("0.1", "10.0")
        assert {v.run_id: v.verdict for v in run_gate(store, gate_file(tmp_path, generous)).verdicts} == {
            "new": "pass", "tiny": "pass"
        }  # fmt: skip

    def test_a_gate_that_judged_nothing_fails(self, store, tmp_path):
        body = LOGLINEAR + 'stat="n"\nmin=1\nrun="tiny"\n'
        result = run_gate(store, gate_file(tmp_path, body), run="base")
        assert [v.verdict for v in result.verdicts] == ["skip"] and result.exit_code == 1
        assert render_table(Judgement(result, (), DEFAULT_LOSS)).endswith("(1 verdicts; nothing was judged)")

    def test_run_option_naming_the_baseline_skips_the_regression_check(self, store, tmp_path):
        body = LOGLINEAR + 'stat="p90"\nbaseline_run="base"\nmax_regression=0.1\n'
        (verdict,) = run_gate(store, gate_file(tmp_path, body), run="base").verdicts
        assert (verdict.run_id, verdict.verdict, verdict.outcome) == ("base", "skip", "not_selected")
        (verdict,) = run_gate(store, gate_file(tmp_path, body), run="new").verdicts
        assert (verdict.run_id, verdict.outcome) == ("new", "regression")

    def test_missing_baseline(self, store, tmp_path):
        for baseline, where in (("gone", "not in the database"), ("new", "has no such rows")):
            body = (
                f'[[check]]\nmethod="rollout"\nmetric="abs_error"\nstat="mean"\nbaseline_run="{baseline}"\n'
            )
            body += 'max_regression=0.1\nrun="base"\n'
            (verdict,) = run_gate(store, gate_file(tmp_path, body)).verdicts
            assert (verdict.verdict, verdict.outcome) == (
                "fail",
                "missing_baseline",
            ) and where in verdict.reason


@pytest.fixture(scope="module")
def decision_store(tmp_path_factory) -> Path:
    """Run `r`: the ground truth's gradient weights and loglinear's errors, flips and weights per staleness
    0..4, with a known gradient mass error that grows with staleness (0.2% .. 3.2%): 2000 tokens per
    staleness, 200 at staleness 3 (too few for the safe staleness at min_tokens 1000). Made once; the tests
    only read it (the gate opens a store read-only)."""
    samples, rng = {}, np.random.default_rng(0)
    for s in range(5):
        n = 200 if s == 3 else 2000
        mass = np.full(n, 2.0)  # sum 2n
        error = np.zeros(n)
        error[: int(n * 0.001 * 2**s)] = 4.0  # sum |dW| = 4 * n * 0.001 * 2^s, gme = 0.002 * 2^s
        flips = (np.arange(n) < n * 0.002).astype(float)  # 0.2% clip flips at every staleness
        samples["r", s, "ground_truth", "grad_weight"] = mass
        samples["r", s, "loglinear", "grad_weight_abs_error"] = error
        samples["r", s, "loglinear", "true_grad_weight"] = mass  # the truth's W on loglinear's tokens
        samples["r", s, "loglinear", "clip_flip"] = flips
        samples["r", s, "loglinear", "behave_imp_weight"] = rng.lognormal(0, 0.3 + 0.1 * s, n)
    return build_store(tmp_path_factory.mktemp("gate") / "decisions", samples, steps=20)


def figure(body: str) -> str:
    return '[[check]]\nmethod="loglinear"\n' + body


class TestFigureChecks:
    def test_gradient_mass_error_over_a_staleness_range_is_a_ratio_of_sums(self, decision_store, tmp_path):
        # staleness 0-2: (4 * (2 + 4 + 8)) / (2 * 6000) = 56 / 12000 = 0.004667, from 14 error tokens in
        # 20 steps: its 95% interval straddles 0.005, so the verdict is undecided (a warning by default)
        body = figure('figure="gradient_mass_error"\nmax=0.005\nstaleness=[0, 2]\n')
        (verdict,) = run_gate(decision_store, gate_file(tmp_path, body)).verdicts
        assert verdict.value == pytest.approx(56 / 12000, rel=1e-12) and verdict.tokens == 6000
        assert (verdict.verdict, verdict.outcome) == ("warn", "inconclusive")
        low, high = verdict.observed.lower, verdict.observed.upper
        assert low < 0.005 < high and verdict.observed.steps == 20

        def more(bound: float) -> float:  # the half-width shrinks as 1/sqrt(steps)
            return 20 * ((high - low) / 2 / abs(56 / 12000 - bound)) ** 2 - 20

        # 0.005 is so close to the figure that it takes more than 10x the 20 steps recorded: absurd
        assert more(0.005) > 200 and verdict.steps_to_decide == "will not decide"
        assert verdict.reason.endswith(": more steps will not decide this")
        near = figure('figure="gradient_mass_error"\nmax=0.006\nstaleness=[0, 2]\n')
        (decidable,) = run_gate(decision_store, gate_file(tmp_path, near)).verdicts
        assert decidable.outcome == "inconclusive" and decidable.steps_to_decide == math.ceil(more(0.006))
        assert f"about {math.ceil(more(0.006))} more steps with prox_logp would decide it" in decidable.reason
        blocking = body + 'on_inconclusive = "fail"\n'
        assert run_gate(decision_store, gate_file(tmp_path, blocking)).verdicts[0].verdict == "fail"
        # every staleness: 4 * (2 + 4 + 8 + 1 + 32) / (2 * 8200); the per-staleness mean would be wrong
        body = figure('figure="gradient_mass_error"\nmax=0.005\n')
        (verdict,) = run_gate(decision_store, gate_file(tmp_path, body)).verdicts
        assert verdict.verdict == "fail" and verdict.value == pytest.approx(4 * 47 / 16400, rel=1e-12)
        assert "gradient_mass_error 1.15% (95%: " in verdict.reason and "> max 0.5%" in verdict.reason

    def test_flip_rate_and_ess(self, decision_store, tmp_path):
        body = figure('figure="clip_flip_rate"\nmax=0.01\n') + figure('figure="ess_fraction"\nmin=0.5\n')
        flip, ess = run_gate(decision_store, gate_file(tmp_path, body)).verdicts
        # 4 flips at each staleness of 2000 tokens, 1 at the one of 200 (np.arange(200) < 0.4)
        assert flip.verdict == "pass" and flip.value == pytest.approx(17 / 8200, rel=1e-12)
        con = connect_store(decision_store)
        w = con.execute(
            "SELECT sum(sum), sum(sum_sq), sum(n) FROM metric_moments WHERE metric = 'behave_imp_weight'"
        )
        total, squares, n = w.fetchone()
        con.close()
        assert ess.value == pytest.approx(total**2 / (n * squares), rel=1e-12) and ess.verdict == "pass"

    def test_safe_staleness(self, decision_store, tmp_path):
        # gme per staleness 0.002, 0.004, 0.008, (0.01 on 200 tokens: skipped), 0.032: the first level
        # with enough tokens above 1% is staleness 4, so the safe staleness is 3
        body = figure('figure="safe_staleness"\nmin=4\nmin_tokens=1000\n')
        (verdict,) = run_gate(decision_store, gate_file(tmp_path, body)).verdicts
        assert (verdict.value, verdict.verdict) == (3, "fail")
        assert verdict.tokens == 8000 and "safe_staleness 3 (95%: " in verdict.reason
        assert "< min 4" in verdict.reason and verdict.observed.lower <= 3 == verdict.observed.upper
        # a looser tolerance: nothing fails, the largest measured staleness (4) is safe
        looser = body.replace("min_tokens=1000", "min_tokens=1000\nmax_gradient_mass_error=0.05")
        assert run_gate(decision_store, gate_file(tmp_path, looser)).verdicts[0].value == 4
        # a stricter one: staleness 0 already fails
        stricter = body.replace("min_tokens=1000", "min_tokens=1000\nmax_gradient_mass_error=0.001")
        assert run_gate(decision_store, gate_file(tmp_path, stricter)).verdicts[0].value == -1
        # no staleness with enough tokens: insufficient data, never a pass
        starved = body.replace("min_tokens=1000", "min_tokens=5000")
        (verdict,) = run_gate(decision_store, gate_file(tmp_path, starved)).verdicts
        assert (verdict.verdict, verdict.outcome) == ("fail", "insufficient_data")

    def test_a_run_without_the_ground_truth_misses_the_figure(self, store, tmp_path):
        body = figure('figure="gradient_mass_error"\nmax=0.01\nrun="base"\n')
        (verdict,) = run_gate(store, gate_file(tmp_path, body)).verdicts
        assert (verdict.verdict, verdict.outcome) == ("fail", "missing_metric")
        assert "loglinear/gradient_mass_error" in verdict.reason


# Safe staleness's edge cases: per run, its levels as (staleness, tokens, gradient mass error, clip flip
# rate); a gradient mass error of inf is error mass over a true mass of 0, nan is 0 over 0.
EDGE_CASES = {
    "few-tokens-first": [(0, 100, 0.5, 0.0), (1, 2000, 0.002, 0.0), (2, 2000, 0.05, 0.0)],  # 0 not judged
    "all-fail": [(0, 2000, 0.02, 0.0), (1, 2000, 0.03, 0.0)],
    "first-judged-fails": [(0, 500, 0.0, 0.0), (1, 2000, 0.02, 0.0)],
    "none-fail": [(0, 2000, 0.001, 0.0), (1, 2000, 0.004, 0.005), (2, 1500, 0.008, 0.0), (3, 10, 0.9, 0.0)],
    "gap": [(0, 2000, 0.001, 0.0), (1, 2000, 0.001, 0.0), (4, 2000, 0.02, 0.0)],
    "gap-all-pass": [(0, 2000, 0.001, 0.0), (3, 2000, 0.001, 0.0)],
    "fails-then-passes": [(0, 2000, 0.001, 0.0), (1, 2000, 0.001, 0.02), (2, 2000, 0.001, 0.0)],
    "zero-true-mass": [(0, 2000, 0.001, 0.0), (1, 2000, math.inf, 0.0), (2, 2000, 0.001, 0.0)],
    "zero-mass-no-error": [(0, 2000, 0.001, 0.0), (1, 2000, math.nan, 0.0), (2, 2000, 0.001, 0.0)],
    "starved": [(0, 999, 0.0, 0.0), (1, 10, 0.0, 0.0)],
}


def edge_samples(levels: dict[str, list[tuple]]) -> dict[tuple, np.ndarray]:
    """Token values that give each level its figures: true gradient weights of 2 (0 where the true mass
    is 0), absolute errors of 4 on the first tokens (all of them for inf), clip flips on the first ones."""
    samples = {}
    for run, rows in levels.items():
        for staleness, n, gme, flips in rows:
            mass = np.full(n, 0.0 if not math.isfinite(gme) else 2.0)
            error = np.zeros(n)
            error[: n if math.isinf(gme) else round(gme * 2 * n / 4) if math.isfinite(gme) else 0] = 4.0
            samples[run, staleness, "ground_truth", "grad_weight"] = mass
            samples[run, staleness, "loglinear", "true_grad_weight"] = mass
            samples[run, staleness, "loglinear", "grad_weight_abs_error"] = error
            samples[run, staleness, "loglinear", "clip_flip"] = (np.arange(n) < round(flips * n)).astype(
                float
            )
    return samples


def edge_expected(run: str) -> int | None:
    """The safe staleness by its definition, from the figures the samples really have (numpy sums)."""
    samples, rows = edge_samples({run: EDGE_CASES[run]}), []
    for staleness, n, _, _ in EDGE_CASES[run]:
        mass = samples[run, staleness, "ground_truth", "grad_weight"].sum()
        error = samples[run, staleness, "loglinear", "grad_weight_abs_error"].sum()
        flips = samples[run, staleness, "loglinear", "clip_flip"].mean()
        # no true mass: nothing to move (0 / 0 meets the tolerance); error mass over none fails (inf)
        gme = error / mass if mass else (math.inf if error else math.nan)
        rows.append((staleness, n, gme, flips))
    levels = pd.DataFrame(rows, columns=["staleness", "n", "gradient_mass_error", "clip_flip_rate"])
    return safe_staleness(levels, 0.01, 0.01, 1000)


def test_safe_staleness_edges_follow_the_definition(tmp_path):
    """The macro `safe_staleness()` and the gate's figure on too few tokens, all or no level failing, gaps
    in the levels, a failure below a pass, and levels with no true gradient mass."""
    store = build_store(tmp_path / "edges", edge_samples(EDGE_CASES), steps=20)
    expected = {run: edge_expected(run) for run in EDGE_CASES}
    assert expected == {
        "few-tokens-first": 1, "all-fail": -1, "first-judged-fails": 0, "none-fail": 2, "gap": 3,
        "gap-all-pass": 3, "fails-then-passes": 0, "zero-true-mass": 0, "zero-mass-no-error": 2,
        "starved": None,
    }  # fmt: skip
    with connect_store(store) as con:
        rows = con.execute("SELECT run_id, safe_staleness, measured_levels FROM safe_staleness()").fetchall()
    assert {run: safe for run, safe, _ in rows} == expected
    judged = {run: sum(n >= 1000 for _, n, _, _ in levels) for run, levels in EDGE_CASES.items()}
    assert {run: measured for run, _, measured in rows} == judged
    body = figure('figure="safe_staleness"\nmin=0\nmin_tokens=1000\n')
    verdicts = {v.run_id: v for v in run_gate(store, gate_file(tmp_path, body)).verdicts}
    for run, safe in expected.items():
        if safe is None:
            assert (verdicts[run].verdict, verdicts[run].outcome) == ("fail", "insufficient_data")
        else:
            assert verdicts[run].value == safe, run
            assert verdicts[run].verdict == ("pass" if safe >= 0 else "fail"), run


class TestStore:
    def test_missing_database(self, tmp_path):
        with pytest.raises(StoreError, match="no metrics store"):
            run_gate(tmp_path / "absent", gate_file(tmp_path, LOGLINEAR + 'stat="n"\nmin=1\n'))

    def test_not_a_store(self, tmp_path):
        thresholds = gate_file(tmp_path, LOGLINEAR + 'stat="n"\nmin=1\n')
        duckdb.connect(str(tmp_path / "other.duckdb")).execute("CREATE TABLE t (x INT)").close()
        with pytest.raises(StoreError, match="not a store folder"):
            run_gate(tmp_path / "other.duckdb", thresholds)
        (tmp_path / "junk.duckdb").write_bytes(b"not a database at all" * 100)
        with pytest.raises(StoreError, match="a file, not a store folder"):
            run_gate(tmp_path / "junk.duckdb", thresholds)

    def test_the_database_is_opened_read_only(self, store, tmp_path):
        catalog = store / "catalog.sqlite"
        files = lambda: sorted((store / "data").rglob("*"))  # noqa: E731
        before = catalog.stat().st_mtime_ns, catalog.read_bytes(), files()
        run_gate(store, gate_file(tmp_path, LOGLINEAR + 'stat="n"\nmin=1\n'))
        assert (catalog.stat().st_mtime_ns, catalog.read_bytes(), files()) == before

    def test_bad_thresholds_is_a_thresholds_error(self, store, tmp_path):
        with pytest.raises(ThresholdsError, match="'stat'"):
            run_gate(
                store,
                gate_file(tmp_path, '[[check]]\nmethod="loglinear"\nmetric="abs_error"\nstat="p95"\nmax=1\n'),
            )


MIXED = """
[defaults]
min_tokens = 100

[[check]]
name = "tail | pipes"
method = "loglinear"
metric = "abs_error"
stat = "p99"
max = 10
run = "base"

[[check]]
method = "loglinear"
metric = "abs_error"
stat = "mean"
max = 1e-9
run = "new"

[[check]]
method = "loglinear"
metric = "abs_error"
stat = "mean"
max = 1e-9
run = "base"
warn_only = true
"""


@pytest.fixture(scope="module")
def mixed(store_made_once, tmp_path_factory) -> Judgement:
    """MIXED judged once on `store_samples()`'s store (the tests read and render it)."""
    return judge_db(store_made_once, gate_file(tmp_path_factory.mktemp("mixed"), MIXED))


class TestReports:
    """MIXED on runs `base` (its p99 passes, its mean only warns) and `new` (its mean fails): the gated
    method is loglinear; `new` fails over every token (do not ship), `base` has no staleness with 1,000
    tokens to judge up to (cannot tell)."""

    def test_the_decisions(self, mixed):
        assert [(d.run_id, d.action, d.method, d.max_staleness) for d in mixed.decisions] == [
            ("base", "undecided", "loglinear", 0), ("new", "do_not_ship", "loglinear", 0)
        ]  # fmt: skip
        new = mixed.decisions[1]
        assert (new.reason.check, new.reason.outcome, new.reason.bound) == (
            mixed.result.verdicts[1].check.name, "threshold", 1e-9
        )  # fmt: skip

    def test_junit_parses_with_one_case_per_decision_and_verdict_and_the_right_counts(self, mixed):
        root = ET.fromstring(render_junit(mixed))
        suite = root.find("testsuite")
        assert (suite.get("tests"), suite.get("failures"), suite.get("skipped"), suite.get("errors")) == (
            "5", "2", "2", "0"
        )  # fmt: skip
        decided, cases = suite.findall("testcase")[:2], suite.findall("testcase")[2:]
        assert [c.get("name") for c in decided] == ["decision on run base", "decision on run new"]
        assert decided[0].find("skipped").get("type") == "undecided"
        failed = decided[1].find("failure")
        assert failed.get("type") == "do_not_ship" and failed.get("message").startswith(
            "Do not ship loglinear"
        )
        assert [c.get("name") for c in cases] == [v.check.name for v in mixed.result.verdicts]
        assert cases[0].find("failure") is None and cases[0].find("skipped") is None
        failure = cases[1].find("failure")
        observed = f"{mixed.result.verdicts[1].value:.6g}"
        assert failure.get("type") == "threshold" and observed in failure.get("message")
        assert cases[2].find("skipped").get("type") == "warning"
        properties = {p.get("name"): p.get("value") for p in cases[1].find("properties")}
        assert (
            properties["verdict"] == "fail"
            and properties["run_id"] == "new"
            and properties["tokens"] == "2200"
        )
        assert properties["warn_only"] == "false" and "staleness" not in properties

    def test_markdown_has_a_status_heading_the_decisions_and_a_row_per_verdict(self, mixed):
        text = render_markdown(mixed)
        assert text.startswith("### proxaudit gate ❌ FAILED")
        decided = [line for line in text.splitlines() if line.startswith("- ")]
        assert decided[0].startswith("- ❔ Cannot tell yet whether to ship loglinear on run ` base `")
        assert decided[1].startswith("- ❌ Do not ship loglinear beyond staleness 0 on run ` new `")
        rows = [line for line in text.splitlines() if line.startswith("| ")]
        assert len(rows) == 2 + 3  # header, alignment row, verdicts
        assert rows[0].startswith("| verdict | requirement |")
        assert "tail \\| pipes" in rows[2] and rows[2].startswith("| ✅ pass")
        assert rows[3].startswith("| ❌ fail") and rows[4].startswith("| ⚠️ warn")

    def test_json_has_every_field(self, mixed):
        document = json.loads(render_json(mixed))
        assert document["passed"] is False and document["exit_code"] == 1
        assert document["counts"] == {"pass": 1, "warn": 1, "fail": 1, "skip": 0}
        first = document["verdicts"][0]
        assert first["name"] == "tail | pipes" and first["stat"] == "p99" and first["max"] == 10.0
        assert first["tokens"] == 2200 and first["verdict"] == "pass" and first["min_tokens"] == 100
        assert {"observed", "threshold", "outcome", "reason", "baseline_value", "staleness"} <= set(first)
        new = document["decisions"][1]
        assert (new["run_id"], new["action"], new["method"], new["max_staleness"]) == (
            "new", "do_not_ship", "loglinear", 0
        )  # fmt: skip
        assert (
            new["reason"]["observed"] == document["verdicts"][1]["observed"]
            and new["reason"]["bound"] == 1e-9
        )
        assert new["sentence"].startswith("Do not ship loglinear beyond staleness 0 on run new:")

    def test_table_lists_the_decisions_then_each_verdict(self, mixed):
        lines = render_table(mixed).splitlines()
        assert lines[0].startswith("Under the loss ") and lines[1].startswith("- Cannot tell yet")
        assert lines[2].startswith("- Do not ship loglinear beyond staleness 0 on run new")
        table = lines[lines.index("") + 1 :]
        assert table[0].split()[:4] == ["verdict", "requirement", "run", "staleness"]
        assert (
            len(table) == 2 + 3 + 2
            and table[-1] == "gate FAILED: 1 failed, 1 warnings, 1 passed, 0 skipped (3 verdicts)"
        )
        assert [row.split()[0] for row in table[2:5]] == ["pass", "FAIL", "warn"]

    def test_a_table_wider_than_the_terminal_becomes_a_block_per_verdict(self, mixed):
        lines = render_table(mixed, width=60).splitlines()
        assert max(map(len, lines)) <= 60
        assert "FAIL  new: loglinear abs_error mean <= 1e-09 [run new]" in lines
        ending = " ".join(line.strip() for line in lines[lines.index("", lines.index("") + 1) + 1 :])
        assert ending == "gate FAILED: 1 failed, 1 warnings, 1 passed, 0 skipped (3 verdicts)"


class TestCli:
    def test_exit_codes_and_reports(self, store, tmp_path):
        runner = CliRunner()
        passing = gate_file(
            tmp_path, '[[check]]\nmethod="loglinear"\nmetric="abs_error"\nstat="max"\nmax=100\nrun="new"\n'
        )
        out = tmp_path / "reports"
        args = ["gate", "--db", str(store), "--thresholds", str(passing)]
        reports = [
            "--junit",
            str(out / "j.xml"),
            "--markdown",
            str(out / "s.md"),
            "--json",
            str(out / "g.json"),
        ]
        result = runner.invoke(cli, args + reports)
        assert result.exit_code == 0, result.output
        assert "gate passed" in result.output
        suite = ET.parse(out / "j.xml").getroot().find("testsuite")
        assert suite.get("tests") == "2"  # the decision, the check
        assert json.loads((out / "g.json").read_text())["passed"] is True
        failing = passing.read_text().replace("max=100", "max=1e-6")
        passing.write_text(failing)
        result = runner.invoke(cli, args + reports)
        assert result.exit_code == 1 and "gate FAILED" in result.output
        assert ET.parse(out / "j.xml").getroot().find("testsuite").get("failures") == "2"  # the decision too

    @pytest.mark.parametrize(
        "body",
        [
            '[[check]]\nmethod="logistic"\nmetric="abs_error"\nstat="mean"\nmax=1\n',
            '[[check]]\nmethod="loglinear"\nmetric="abs_err"\nstat="mean"\nmax=1\n',
            '[[check]]\nmethod="loglinear"\nmetric="abs_error"\nstat="p95"\nmax=1\n',
            '[[check]]\nmethod="loglinear"\nmetric="abs_error"\nstat="mean"\n',
            "[[check]\n",
        ],
        ids=["method", "metric", "stat", "no-condition", "toml"],
    )
    def test_bad_thresholds_exit_2(self, store, tmp_path, body):
        result = CliRunner().invoke(
            cli, ["gate", "--db", str(store), "--thresholds", str(gate_file(tmp_path, body))]
        )
        assert result.exit_code == 2 and "gate.toml" in result.output

    def test_missing_database_and_thresholds_exit_2(self, store, tmp_path):
        good = gate_file(tmp_path, '[[check]]\nmethod="loglinear"\nmetric="abs_error"\nstat="mean"\nmax=1\n')
        result = CliRunner().invoke(cli, ["gate", "--db", str(tmp_path / "no"), "--thresholds", str(good)])
        assert result.exit_code == 2 and "no metrics store" in result.output
        result = CliRunner().invoke(
            cli, ["gate", "--db", str(store), "--thresholds", str(tmp_path / "no.toml")]
        )
        assert result.exit_code == 2 and "not found" in result.output

    @pytest.mark.parametrize("option", ["--markdown", "--junit", "--json"])
    @pytest.mark.parametrize(
        "where, says",
        [
            ("", "an empty path"),  # `--markdown "$GITHUB_STEP_SUMMARY"` outside GitHub Actions
            (".", "a folder, not a file"),
            ("reports/", "a folder, not a file"),
            ("a-file/gate.out", "is a file, not a folder"),
        ],
        ids=["empty", "dot", "slash", "under-a-file"],
    )
    def test_a_report_path_that_cannot_take_a_file_is_a_usage_error_before_any_work(
        self, store, tmp_path, monkeypatch, option, where, says
    ):
        monkeypatch.chdir(tmp_path)
        (tmp_path / "a-file").write_text("kept")
        result = CliRunner().invoke(cli, ["gate", "--db", str(store), option, where])
        assert result.exit_code == 2, result.output
        assert f"Invalid value for '{option}'" in result.output and says in result.output
        assert "gate passed" not in result.output and "gate FAILED" not in result.output  # judged nothing
        assert (tmp_path / "a-file").read_text() == "kept" and not (tmp_path / "reports").exists()

    def test_the_readme_gate_line_leaves_markdown_out_outside_github(self, repo_root):
        """The README's gate line, run by bash with `proxaudit` printing its arguments: without
        GITHUB_STEP_SUMMARY no --markdown (an empty one is refused), with it the file it names."""
        import os
        import re
        import subprocess

        readme = (repo_root / "README.md").read_text()
        (line,) = [x.strip() for x in readme.splitlines() if x.strip().startswith("proxaudit gate --db")]
        assert "GITHUB_STEP_SUMMARY" in line
        script = "proxaudit() { printf '%s\\n' \"$@\"; }\n" + line
        env = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}
        outside = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=True)
        assert "--markdown" not in outside.stdout.split() and "" not in outside.stdout.splitlines()
        env["GITHUB_STEP_SUMMARY"] = "/tmp/summary.md"
        inside = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=True)
        args = inside.stdout.splitlines()
        assert args[args.index("--markdown") + 1] == "/tmp/summary.md"
        assert re.search(r"--junit \S+", line)

    def test_help(self):
        result = CliRunner().invoke(cli, ["gate", "--help"])
        assert result.exit_code == 0
        for option in ("--db", "--thresholds", "--run", "--junit", "--markdown", "--json"):
            assert option in result.output
