"""The verdict watch reads (evaluator.watch.judge) and the trends it tests (evaluator.watch.trends), on a
simulated run with a drift planted and on the fixture runs: the gate's decision on each run, the planted
drift failing, and the trends' slopes as scipy's over per-step figures summed from the store's raw
moments."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import linregress

from evaluator.gate import load_thresholds
from evaluator.replay import replay
from evaluator.store import connect_store, open_store
from evaluator.trainer.simulated_run import SimulatedRun
from evaluator.verdict import judge_db, sentence
from evaluator.verdict.judging import judge_store
from evaluator.watch.judge import gated, judge_runs
from evaluator.watch.trends import FLOOR, run_trends
from schemas.thresholds import DEFAULT_THRESHOLDS
from tests.recording import Recorder

METHOD = "loglinear_shipped"
DRIFTING = SimulatedRun(run_id="drifting", tokens_per_step=4096, drift_from_step=4, drift_rate=0.03)


@pytest.fixture(scope="module")
def drifting_store(tmp_path_factory):
    """14 steps in 2 files of 7 (the store holds steps, however cut); the policy speeds up from step 4 (the
    approximation fails by step 13)."""
    folder = tmp_path_factory.mktemp("drifting")
    logs = [replace(DRIFTING, steps_per_file=7).write_file(folder / "logs", i) for i in range(2)]
    replay(logs, folder / "metrics", progress=False, workers=1)  # in this process: no workers to start
    return folder / "metrics"


def thresholds_file(folder: Path, bound: float, min_tokens: int = 1000) -> Path:
    """The default thresholds with every bound of the gated method's excess checks at `bound` and
    `min_tokens` tokens needed."""
    text = DEFAULT_THRESHOLDS.read_text().replace("max = 0.01", f"max = {bound}")
    text = text.replace("min_tokens = 1000", f"min_tokens = {min_tokens}")
    path = folder / f"thresholds-{bound}-{min_tokens}.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("store", ["drifting_store", "fixture_store"])
@pytest.mark.parametrize("max_staleness", [None, 1, 3])
def test_watch_says_the_decision_the_gate_makes(store, max_staleness, request):
    """watch reads each run's decision through `judge_runs`: the gate's (`proxaudit gate`, whose decisions
    tests/test_gate_levels.py checks against numpy), with its sentence."""
    db = request.getfixturevalue(store)
    decisions = judge_db(db, max_staleness=max_staleness).decisions
    verdicts = judge_runs(db, max_staleness=max_staleness)
    assert [v.run_id for v in verdicts] == [d.run_id for d in decisions]
    for v, d in zip(verdicts, decisions, strict=True):
        assert (v.action, v.max_staleness, v.method, v.steps_to_decide) == (
            d.action, d.max_staleness, d.method, d.steps_to_decide
        )  # fmt: skip
        assert v.reason == sentence(d)


def test_watch_leaves_the_trainers_figures_unread(drifting_store):
    """An alert carries no trainer's figure: watch's judging does not ask the store for them (on a long run,
    a query over every file's moments at each look), and its decisions are the full judging's."""
    thresholds = load_thresholds(DEFAULT_THRESHOLDS)
    with open_store(drifting_store) as con:
        full = judge_store(con, thresholds, str(drifting_store), alternatives=False)
        assert full.trainers
        recorder = Recorder(con)
        bare = judge_store(recorder, thresholds, str(drifting_store), alternatives=False, trainers=False)
    asked = recorder.queries
    assert bare.trainers == () and asked and not any("trainer_mismatch" in q for q in asked)
    said = [(d.action, d.max_staleness, d.method, sentence(d)) for d in bare.decisions]
    assert said == [(d.action, d.max_staleness, d.method, sentence(d)) for d in full.decisions]


def test_the_planted_drift_is_do_not_ship(drifting_store):
    (v,) = judge_runs(drifting_store)
    assert v.action == "do_not_ship" and v.max_staleness == 0 and v.method == METHOD
    assert v.reason.startswith(f"Do not ship {METHOD}") and "gradient mass" in v.reason


def test_lax_thresholds_ship_and_a_run_without_enough_tokens_is_undecided(drifting_store, tmp_path):
    (v,) = judge_runs(drifting_store, load_thresholds(thresholds_file(tmp_path, 0.5)))
    assert v.action == "ship" and v.reason.startswith(f"Ship {METHOD}")
    (v,) = judge_runs(drifting_store, load_thresholds(thresholds_file(tmp_path, 0.01, 10**9)))
    assert v.action == "undecided"


def test_the_trends_follow_the_gated_method_and_its_bound(tmp_path):
    gate = gated(load_thresholds(thresholds_file(tmp_path, 0.03)))
    assert (gate.method, gate.tolerance) == (METHOD, 0.03)


def raw_step_figures(db, method: str, lo: int, hi: int) -> dict[int, float]:
    """{step: sum |W(a) - W(g)| / sum W(g)} over stalenesses lo..hi, from the raw moments table."""
    with connect_store(db) as con:
        rows = con.execute(
            "SELECT step, sum(sum) FILTER (WHERE metric = 'grad_weight_abs_error'), "
            "sum(sum) FILTER (WHERE metric = 'true_grad_weight') FROM metric_moments "
            "WHERE method = ? AND staleness BETWEEN ? AND ? GROUP BY step",
            [method, lo, hi],
        ).fetchall()
    return {step: moved / mass for step, moved, mass in rows if mass}


def test_the_trends_are_scipys_slopes_of_the_per_step_figures(drifting_store):
    floor = raw_step_figures(drifting_store, "rollout", 0, 0)
    method = raw_step_figures(drifting_store, METHOD, 1, 100)
    excess = {s: method[s] - floor[s] for s in method if s in floor}
    found = {t.subject: t.trend for t in run_trends(drifting_store, METHOD, 0.01)}
    for subject, points in ((FLOOR, floor), (METHOD, excess)):
        steps = sorted(points)
        reference = linregress(steps, [points[s] for s in steps])
        assert found[subject].n_steps == len(steps)
        assert found[subject].slope == pytest.approx(reference.slope, rel=1e-9)
        assert found[subject].intercept == pytest.approx(reference.intercept, rel=1e-9, abs=1e-12)
    assert found[METHOD].drifting and found[METHOD].lower > 0  # the planted drift
    assert not found[FLOOR].drifting  # the engine did not change
    assert np.isfinite(found[FLOOR].upper)
