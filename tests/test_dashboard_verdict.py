"""The Overview's verdict banner and what a new user tripped over, through AppTest. Every number the banner
says is checked against numpy over the token log (tests/reference.py) or the store's own tables (the
intervals are a bootstrap kept in `decision_interval` and `mean_interval`), never against the dashboard's
query functions; the verdicts are judged here from those bounds by their definitions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from test_dashboard_app import fixture_logs, frame_with, no_exception, run_app, texts

from dashboard import token_estimates
from dashboard.views.common import plain
from evaluator.formulas.loss import DEFAULT_LOSS, Loss
from evaluator.store import connect_store
from tests.reference import decision_figures, estimates, loss_tokens, reference_values, safe_staleness

TOLERANCE = 0.01  # the default tolerance and the default thresholds' bound, both figures
BLOCKING = {  # the default thresholds' blocking checks: (interval of), staleness, method, figure
    "the engine floor moves at most 1% of the gradient mass": ("", 0, "rollout", "gradient_mass_error"),
    "the engine floor flips at most 1% of PPO clip decisions": ("", 0, "rollout", "clip_flip_rate"),
    "loglinear_shipped moves at most 1% of the gradient mass beyond the engine floor": (
        "excess_", None, "loglinear_shipped", "gradient_mass_error"),
    "loglinear_shipped flips at most 1% of PPO clip decisions beyond the engine floor": (
        "excess_", None, "loglinear_shipped", "clip_flip_rate"),
    "loglinear_shipped flips at most 1% of behaviour-weight bound decisions beyond the engine floor": (
        "excess_", None, "loglinear_shipped", "bound_flip_rate"),
}  # fmt: skip


@pytest.fixture(scope="module")
def engine_store(tmp_path_factory) -> tuple[Path, list[Path]]:
    """A synthetic run whose inference engine is far from its trainer: the engine floor fails."""
    from evaluator.logio import write_log_atomic
    from evaluator.replay import replay
    from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps

    folder = tmp_path_factory.mktemp("engine")
    spec = SyntheticSpec(
        run_id="engine", tokens_per_step=1024, mean_length=24, drift=0.3, engine_mismatch=0.3
    )
    files = [write_log_atomic(synthetic_steps(spec, 0, 30), folder / "engine.parquet")]
    replay(files, folder / "m.duckdb", progress=False)
    return folder / "m.duckdb", files


def banner(at) -> str:
    """The banner's Markdown: the first alert of the page that gives the gate's verdict."""
    return next(box.value for box in [*at.error, *at.warning, *at.success, *at.info] if "Gate" in box.value)


def table(db: Path, sql: str, params: list) -> pd.DataFrame:
    with connect_store(db) as con:
        return con.execute(sql, params).df()


def intervals(db: Path, run: str) -> pd.DataFrame:
    """The stored bootstrap bounds of the decision figures: (staleness or -1 for the run, method, figure)."""
    frame = table(db, "SELECT * FROM decision_interval WHERE run_id = ?", [run])
    return frame.fillna({"staleness": -1}).set_index(["staleness", "method", "figure"])


def floor_word(figures: dict[str, tuple[float, float, float]]) -> str:
    """The floor's verdict by its definition: fails when an interval is wholly beyond the tolerance, passes
    when both are within it, else inconclusive, said by the point estimates."""
    judged = {"fail" if lo > TOLERANCE else "pass" if hi <= TOLERANCE else "inconclusive"
              for _, lo, hi in figures.values()}  # fmt: skip
    over = any(point > TOLERANCE for point, _, _ in figures.values())
    if "fail" in judged:
        return "fails the tolerance"
    if "inconclusive" in judged:
        return f"{'fails' if over else 'passes'} the tolerance by its point estimate, inconclusive at 95%"
    return "passes the tolerance"


def expected_banner(db: Path, files: list[Path], run: str) -> list[str]:
    """What the banner must say about `run` under the default thresholds and tolerance."""
    values = reference_values(files)
    zero = values[values["staleness"] == 0]
    floor = decision_figures(zero, ["run_id"]).xs("rollout", level="method").iloc[0]
    bounds = intervals(db, run)
    figures = {
        f: (floor[f], *bounds.loc[(0, "rollout", f), ["lower", "upper"]])
        for f in ("gradient_mass_error", "clip_flip_rate")
    }
    drift = {
        m: zero.query("method == 'ground_truth' and metric == @m")["value"]
        for m in ("prob_drift", "exp_abs_drift")
    }
    means = table(db, "SELECT metric, lower, upper FROM mean_interval WHERE run_id = ? AND staleness = 0 AND "
                  "method = 'ground_truth'", [run]).set_index("metric")  # fmt: skip
    prob, exp = drift["prob_drift"].mean(), drift["exp_abs_drift"].mean()
    verl = "normal" if prob < 0.005 else "a precision problem" if prob > 0.01 else "above normal"
    gme, lo, hi = figures["gradient_mass_error"]
    flips, flo, fhi = figures["clip_flip_rate"]
    fails = [name for name, (kind, s, method, figure) in BLOCKING.items()
             if bounds.loc[(-1 if s is None else s, method, figure), f"{kind}lower"] > TOLERANCE]  # fmt: skip
    return [
        f"**Verdict on run {plain(run)}**",
        f"**Gate {'FAILED' if fails else 'passed'}",
        "(the default thresholds, schemas/default_thresholds.toml;",
        f"{len(fails)} checks fail",
        *[plain(name) for name in fails],
        "These thresholds gate `loglinear_shipped`. `loglinear_shipped` is what AReaL's prox_logp_method "
        "loglinear computes",
        f"**Engine floor: {floor_word(figures)}.**",
        f"moves **{gme:.2%}** of the gradient mass (95%: {lo:.2%} to {hi:.2%})",
        f"flips **{flips:.2%}** of the clip decisions (95%: {flo:.2%} to {fhi:.2%})",
        f"Mean prob_drift **{prob:.4f}** (95%: {means.loc['prob_drift', 'lower']:.4f} to "
        f"{means.loc['prob_drift', 'upper']:.4f}): **{verl}** by verl's lines",
        f"mean exp_abs_drift **{exp:.4f}** (95%: {means.loc['exp_abs_drift', 'lower']:.4f} to "
        f"{means.loc['exp_abs_drift', 'upper']:.4f}): **{'flagged' if exp > 1.05 else 'not flagged'}** by "
        "NeMo-RL's line (1.05).",
        safe_sentence(values, floor, bounds, "loglinear_shipped"),
    ]


def safe_sentence(values: pd.DataFrame, floor: pd.Series, bounds: pd.DataFrame, method: str) -> str:
    """The method's safe staleness beyond the floor by its definition: on the excess per staleness (numpy)
    for the point, on the stored interval bounds of the excess for 95% confidence and at most."""
    levels = decision_figures(values, ["staleness"]).xs(method, level="method").reset_index()
    excess = levels.assign(gradient_mass_error=levels["gradient_mass_error"] - floor["gradient_mass_error"],
                           clip_flip_rate=levels["clip_flip_rate"] - floor["clip_flip_rate"])  # fmt: skip
    point = safe_staleness(excess, TOLERANCE, TOLERANCE, 1000)
    ends = {}
    for end, bound in (("lower", "excess_upper"), ("upper", "excess_lower")):
        judged = levels[["staleness", "n"]].copy()
        for figure in ("gradient_mass_error", "clip_flip_rate"):
            judged[figure] = [bounds.loc[(s, method, figure), bound] for s in levels["staleness"]]
        ends[end] = safe_staleness(judged, TOLERANCE, TOLERANCE, 1000)
    return (
        f"safe beyond the engine floor up to staleness {ends['lower']} with 95% confidence (point estimate "
        f"{point}, at most {ends['upper']})"
    )


@pytest.mark.parametrize("store", ["engine", "fixture"])
def test_the_banner_says_the_verdict(store, engine_store, fixture_store, monkeypatch):
    """A run whose engine floor fails (synthetic) and a real run whose floor passes (the fixture's first 30
    steps of SmolLM2): the banner opens the page and says each part of the verdict."""
    db, files, run = (
        (*engine_store, "engine")
        if store == "engine"
        else (fixture_store, fixture_logs("recompute"), "recompute")
    )
    at = run_app(db, monkeypatch, page="overview", run=run)
    no_exception(at)
    text = banner(at)
    for part in expected_banner(db, files, run):
        assert part in text, (part, text)
    loss = Loss.from_dict(
        json.loads(table(db, "SELECT value FROM store_meta WHERE key = 'loss'", [])["value"][0])
    )
    named = plain("proxaudit default: token PPO, clip 0.2, behaviour weight masked above 5")
    assert loss == DEFAULT_LOSS and f"replayed under: {plain(loss.describe())} ({named})." in text
    advice = "Fix the engine's precision before blaming the approximation."
    assert (advice in text) == (store == "engine")  # its floor's point estimates are over the tolerance
    checks = frame_with(at, "judges")
    assert (
        not checks.isna().any().any()
    )  # no None cell: a check without a method or metric says what it judges
    assert list(checks["verdict"]) == sorted(checks["verdict"], key=["fail", "warn", "pass", "skip"].index)


def test_the_banner_names_the_thresholds_and_the_method_they_gate(fixture_store, tmp_path, monkeypatch):
    gate = tmp_path / "gate.toml"
    gate.write_text('[[check]]\nname = "loglinear within 50%"\nmethod = "loglinear"\nfigure = '
                    '"gradient_mass_error"\nmax = 0.5\n')  # fmt: skip
    at = run_app(fixture_store, monkeypatch, page="overview", run="loglinear", thresholds=gate)
    no_exception(at)
    text = banner(at)
    assert f"**Gate passed** (thresholds {plain('gate.toml')}): 0 checks fail, 0 warn, 1 pass." in text
    assert "These thresholds gate `loglinear`. (AReaL's `loglinear` computes `loglinear_shipped`" in text
    assert "**Safe staleness** of loglinear: safe beyond the engine floor" in text
    gate.write_text("[[check]]\nmethod = 'no_such_method'\n")
    at = run_app(fixture_store, monkeypatch, page="overview", run="loglinear", thresholds=gate)
    no_exception(at)
    assert f"**Gate: cannot judge** (thresholds {plain('gate.toml')}): " in banner(at)
    assert "Engine floor: passes" in banner(at)  # the rest of the verdict still stands


def test_compare_lists_the_decision_figures_with_intervals(fixture_store, monkeypatch):
    at = run_app(fixture_store, monkeypatch, page="compare", run="recompute", A_method="loglinear_shipped",
                 B_run="loglinear", B_method="loglinear_shipped")  # fmt: skip
    no_exception(at)
    figures = frame_with(at, "gradient_mass_error 95%")
    names = ["A: recompute / loglinear_shipped", "B: loglinear / loglinear_shipped"]
    assert list(figures.index) == names
    for name, run in zip(names, ("recompute", "loglinear"), strict=True):
        want = decision_figures(reference_values(fixture_logs(run)), ["run_id"]).loc[
            (run, "loglinear_shipped")
        ]
        assert figures.loc[name, "gradient_mass_error"] == pytest.approx(
            want["gradient_mass_error"], rel=1e-9
        )
        lo, hi = intervals(fixture_store, run).loc[
            (-1, "loglinear_shipped", "gradient_mass_error"), ["lower", "upper"]
        ]
        assert figures.loc[name, "gradient_mass_error 95%"] == f"{100 * lo:.2f}% .. {100 * hi:.2f}%"
    side = frame_with(at, "B / A")
    assert not side.isna().any().any() and "None" not in side.to_numpy()
    a, b = (fixture_logs(run) for run in ("recompute", "loglinear"))
    errors = [
        reference_values(f).query("method == 'loglinear_shipped' and metric == 'abs_error'")["value"]
        for f in (a, b)
    ]
    assert side.loc["mean", "B / A"] == f"{errors[1].mean() / errors[0].mean():.4g}"
    assert side.loc["min", "B / A"] == (
        "n/a (A is 0)" if errors[0].min() == 0 else f"{errors[1].min() / errors[0].min():.4g}"
    )


def test_inspector_defaults_to_a_step_with_prox_and_says_when_a_link_misses(fixture_store, monkeypatch):
    """The loglinear run recomputed prox on even steps only: in steps 11..16 the middle (13) has none, so
    the page opens on a step next to it that has; a link's step outside the run is said, not swapped."""
    tokens = pd.concat([pq.read_table(f).to_pandas() for f in fixture_logs("loglinear")])
    with_prox = set(tokens.loc[tokens["prox_logp"].notna(), "step"])
    at = run_app(fixture_store, monkeypatch, page="tokens", run="loglinear", steps="11-16")
    no_exception(at)
    step = at.number_input(key="step").value
    assert step in with_prox and abs(step - 13) == 1 and 13 not in with_prox
    assert not at.warning
    at = run_app(fixture_store, monkeypatch, page="tokens", run="loglinear", step="999")
    no_exception(at)
    assert at.warning[0].value.startswith(f"The link asks for step = {plain('999')}, which is not here (run ")
    assert f"showing step = {plain(str(at.number_input(key='step').value))}." in at.warning[0].value
    at = run_app(fixture_store, monkeypatch, page="tokens", run="loglinear", step="13")
    assert "Step 13 has no prox_logp" in texts(at)
    names = {trace["name"] for trace in json.loads(at.get("plotly_chart")[0].proto.spec)["data"]}
    assert "loglinear_shipped (estimate)" in names and not names & {
        "prox_logp",
        "loglinear_shipped - prox_logp",
    }
    at = run_app(fixture_store, monkeypatch, page="tokens", run="loglinear", step="12")
    names = {trace["name"] for trace in json.loads(at.get("plotly_chart")[0].proto.spec)["data"]}
    assert {"loglinear_shipped (estimate)", "prox_logp", "loglinear_shipped - prox_logp"} <= names


def test_inspector_estimates_are_the_estimators_on_the_raw_tokens():
    """The inspector's estimates and errors against numpy over the same tokens (tests/reference.py)."""
    tokens = loss_tokens(fixture_logs("recompute"))
    tokens = tokens[
        (tokens["step"] == 12) & (tokens["seq_id"] == tokens.loc[tokens["step"] == 12, "seq_id"].max())
    ]
    expected = estimates(tokens)
    got = token_estimates.per_token(tokens.drop(columns=["prev_version"]).sort_values("pos"), 12)
    for method, values in expected.items():
        if method == "ground_truth":
            continue
        part = got[got["method"] == method].sort_values("pos")
        np.testing.assert_allclose(part["estimate"], values, rtol=0, atol=1e-12, err_msg=method)
        np.testing.assert_allclose(part["error"], values - expected["ground_truth"], rtol=0, atol=1e-12)


def test_the_heat_map_says_why_cells_are_blank(fixture_store, monkeypatch):
    tokens = loss_tokens(fixture_logs("loglinear"))
    steps, with_prox = tokens["step"].nunique(), tokens.loc[tokens["prox_logp"].notna(), "step"].nunique()
    at = run_app(fixture_store, monkeypatch, page="training", run="loglinear")
    no_exception(at)
    assert (
        f"This run recorded prox_logp on {with_prox} of its {steps} steps" in texts(at) and with_prox < steps
    )
    at = run_app(fixture_store, monkeypatch, page="training", run="recompute")
    assert "Blank cells have no token with prox_logp" in texts(at) and "This run recorded" not in texts(at)
