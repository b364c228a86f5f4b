"""The verdict watch reads (evaluator.watch.judge) and the trends it tests (evaluator.watch.trends), on a
simulated run with a drift planted and on the fixture runs: each staleness judged as the gate judges it
(the gate recomputes the excess intervals from the step sums: another path to the same figures), the
action by the documented rule, and the trends' slopes as scipy's over per-step figures summed from the
store's raw moments."""

from __future__ import annotations

import functools
from pathlib import Path

import duckdb
import numpy as np
import pytest
from scipy.stats import linregress

from evaluator.gate import run_gate
from evaluator.replay import replay
from evaluator.trainer.simulated_run import SimulatedRun
from evaluator.watch.judge import judge_runs
from evaluator.watch.trends import FLOOR, run_trends
from schemas.store import Tolerance

METHOD = "loglinear_shipped"
DRIFTING = SimulatedRun(run_id="drifting", tokens_per_step=4096, drift_from_step=4, drift_rate=0.03)


@pytest.fixture(scope="module")
def drifting_store(tmp_path_factory):
    """14 files of one step each; the policy speeds up from step 4 (the approximation fails by step 13)."""
    folder = tmp_path_factory.mktemp("drifting")
    logs = [DRIFTING.write_file(folder / "logs", i) for i in range(14)]
    replay(logs, folder / "metrics.duckdb", progress=False)
    return folder / "metrics.duckdb"


@pytest.fixture(scope="module")
def gate_levels(tmp_path_factory):
    """`levels(db, tolerance)`: {(run, staleness): pass | fail | inconclusive} by the gate, the worst of the
    excess gradient mass error and clip flip rate checks on that staleness alone (too few tokens: not
    judged, left out); kept per store and tolerance (the stores are never written again)."""
    folder = tmp_path_factory.mktemp("thresholds")

    @functools.cache
    def levels(db: Path, tolerance: Tolerance) -> dict[tuple[str, int], str]:
        checks = [
            f'[[check]]\nname = "{figure} {s}"\nmethod = "{METHOD}"\nfigure = "excess_{figure}"\n'
            f'staleness = {s}\nmax = {limit}\nmin_tokens = {tolerance.min_tokens}\non_insufficient = "warn"\n'
            for s in range(1, 9)
            for figure, limit in (
                ("gradient_mass_error", tolerance.max_gradient_mass_error),
                ("clip_flip_rate", tolerance.max_clip_flip_rate),
            )
        ]  # fmt: skip
        toml = folder / f"levels-{len(list(folder.iterdir()))}.toml"
        toml.write_text("\n".join(checks))
        found: dict[tuple[str, int], set[str]] = {}
        for v in run_gate(db, toml).verdicts:
            if v.outcome in ("ok", "threshold", "inconclusive"):
                found.setdefault((v.run_id, v.check.staleness[0]), set()).add(v.outcome)
        worst = {"threshold": "fail", "inconclusive": "inconclusive", "ok": "pass"}
        return {key: next(worst[o] for o in worst if o in outcomes) for key, outcomes in found.items()}

    return levels


def expected_action(levels: dict[int, str], user_max: int | None = None) -> tuple[str, int | None]:
    """The documented rule on one run's judged stalenesses (those up to the user's maximum)."""
    levels = {s: o for s, o in levels.items() if user_max is None or s <= user_max}
    if not levels:
        return "undecided", None
    safe = 0
    for s in sorted(levels):
        if levels[s] != "pass":
            break
        safe = s
    if all(o == "pass" for o in levels.values()):
        return ("undecided" if user_max is not None and max(levels) < user_max else "ship"), max(levels)
    if "fail" in levels.values():
        return ("ship_up_to", safe) if safe else ("do_not_ship", None)
    return "undecided", safe or None


@pytest.mark.parametrize("store", ["drifting_store", "fixture_store"])
@pytest.mark.parametrize(
    "tolerance",
    [Tolerance(), Tolerance(0.03, 0.02, 400), Tolerance(0.5, 0.5, 400)],
    ids=["default", "loose", "lax"],
)
def test_each_run_is_judged_as_the_gate_judges_each_staleness(store, tolerance, request, gate_levels):
    db = request.getfixturevalue(store)
    levels = gate_levels(db, tolerance)
    verdicts = judge_runs(db, METHOD, tolerance)
    assert verdicts and {v.run_id for v in verdicts} >= {run for run, _ in levels}
    for v in verdicts:
        mine = {s: o for (run, s), o in levels.items() if run == v.run_id}
        assert (v.action, v.max_staleness) == expected_action(mine), (v, mine)
        assert v.method == METHOD


def test_the_planted_drift_is_do_not_ship(drifting_store):
    (v,) = judge_runs(drifting_store)
    assert v.action == "do_not_ship"
    assert "fails at staleness" in v.reason and "excess gradient mass error" in v.reason


@pytest.mark.parametrize("user_max", [1, 3, 12])
def test_the_users_max_staleness_bounds_what_is_judged(drifting_store, gate_levels, user_max):
    lax = Tolerance(0.5, 0.5, 400)  # every staleness with enough tokens passes
    for tolerance in (Tolerance(), lax):
        levels = {s: o for (_, s), o in gate_levels(drifting_store, tolerance).items()}
        (v,) = judge_runs(drifting_store, tolerance=tolerance, max_staleness=user_max)
        assert (v.action, v.max_staleness) == expected_action(levels, user_max), (levels, v)
    if user_max == 12:  # staleness 9-12 never occurs in this run: shipping at 12 cannot be vouched for
        assert v.action == "undecided" and "staleness 9-12 has fewer than 400 tokens" in v.reason


def test_a_run_without_enough_tokens_is_undecided(one_step_store):
    (v,) = judge_runs(one_step_store, tolerance=Tolerance(min_tokens=10**9))
    assert v.action == "undecided" and v.max_staleness is None and "tokens with prox_logp yet" in v.reason


def raw_step_figures(db, method: str, lo: int, hi: int) -> dict[int, float]:
    """{step: sum |W(a) - W(g)| / sum W(g)} over stalenesses lo..hi, from the raw moments table."""
    with duckdb.connect(str(db), read_only=True) as con:
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
    found = {t.subject: t.trend for t in run_trends(drifting_store, METHOD)}
    for subject, points in ((FLOOR, floor), (METHOD, excess)):
        steps = sorted(points)
        reference = linregress(steps, [points[s] for s in steps])
        assert found[subject].n_steps == len(steps)
        assert found[subject].slope == pytest.approx(reference.slope, rel=1e-9)
        assert found[subject].intercept == pytest.approx(reference.intercept, rel=1e-9, abs=1e-12)
    assert found[METHOD].drifting and found[METHOD].lower > 0  # the planted drift
    assert not found[FLOOR].drifting  # the engine did not change
    assert np.isfinite(found[FLOOR].upper)
