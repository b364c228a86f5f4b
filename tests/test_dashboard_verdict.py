"""The Overview's decision banner and what a new user tripped over, through AppTest. Every number the banner
says is checked against numpy over the token log (tests/reference.py) or the store's own tables (the stored
intervals of `decision_interval`, the per-step sums of `metric_moments` for each staleness's family-wise
interval), never against the dashboard's query functions; the verdicts are judged here from those bounds by
their definitions."""

from __future__ import annotations

import functools
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
from tests.reference import decision_figures, estimates, expected_decision, loss_tokens, reference_values

TOLERANCE = 0.01  # the default tolerance and the default thresholds' bound, both figures
OPTION = "loglinear_shipped (AReaL actor.prox_logp_method: loglinear)"
KEY = plain("max_head_offpolicyness")  # the trainer's key, as the store recorded it: data, so quoted
SAYS = {
    "gradient_mass_error": "moves {} of the gradient mass",
    "clip_flip_rate": "flips {} of PPO clip decisions",
    "bound_flip_rate": "flips {} of behaviour-weight bound decisions",
}


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
    replay(files, folder / "m", progress=False)
    return folder / "m", files


@functools.cache
def values_of(files: tuple[Path, ...]) -> pd.DataFrame:
    """`reference_values` of token logs, computed once per process (the logs never change; callers only
    read the frame)."""
    return reference_values(files)


@functools.cache
def decision_of(db: Path, files: tuple[Path, ...], run: str) -> dict:
    """`expected_decision` of `run`, computed once per process (the stores never change)."""
    return expected_decision(db, files, run)


def banner(at) -> str:
    """The banner's Markdown: the first alert of the page that gives the decision on the run."""
    boxes = [*at.error, *at.warning, *at.success, *at.info]
    return next(box.value for box in boxes if "Decision on run" in box.value)


def table(db: Path, sql: str, params: list) -> pd.DataFrame:
    with connect_store(db) as con:
        return con.execute(sql, params).df()


def intervals(db: Path, run: str) -> pd.DataFrame:
    """The stored bootstrap bounds of the decision figures: (staleness or -1 for the run, method, figure)."""
    frame = table(db, "SELECT * FROM decision_interval WHERE run_id = ?", [run])
    return frame.fillna({"staleness": -1}).set_index(["staleness", "method", "figure"])


def percent(point: float, lower: float, upper: float, confidence: str = "95%") -> str:
    joined = (
        f"{100 * lower:.2f}-{100 * upper:.2f}%" if lower >= 0 else f"{100 * lower:.2f} to {100 * upper:.2f}%"
    )
    return f"{100 * point:.2f}% ({confidence}: {joined})"


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


def floor_parts(db: Path, files: list[Path], run: str) -> tuple[list[str], bool]:
    """What the banner says of the engine floor (numpy over the logs, the store's stored intervals), and
    whether a floor check fails."""
    values = values_of(tuple(files))
    zero = values[values["staleness"] == 0]
    floor = decision_figures(zero, ["run_id"]).xs("rollout", level="method").iloc[0]
    bounds = intervals(db, run)
    figures = {
        f: (floor[f], *bounds.loc[(0, "rollout", f), ["lower", "upper"]])
        for f in ("gradient_mass_error", "clip_flip_rate")
    }
    prob, exp = (
        zero.query("method == 'ground_truth' and metric == @m")["value"].mean()
        for m in ("prob_drift", "exp_abs_drift")
    )
    verl = "normal" if prob < 0.005 else "a precision problem" if prob > 0.01 else "above normal"
    parts = [
        f"Engine floor of run {plain(run)}: {floor_word(figures)}: at staleness 0, where every estimate is "
        f"behave_logp, the inference engine alone moves {percent(*figures['gradient_mass_error'])} of the "
        f"gradient mass and flips {percent(*figures['clip_flip_rate'])} of the clip decisions (tolerance 1%)",
        f"; mean prob_drift {prob:.4f} (verl: {verl})",
        f", exp_abs_drift {exp:.4f} ({'flagged' if exp > 1.05 else 'not flagged'} by NeMo-RL).",
    ]
    return parts, any(lo > TOLERANCE for _, lo, _ in figures.values())


def expected_banner(db: Path, files: list[Path], run: str) -> list[str]:
    """What the banner must say about `run` under the default thresholds and tolerance: the decision by its
    rule on the excess at each staleness (recomputed from the stored per-step sums), the engine floor."""
    decision = decision_of(db, tuple(files), run)
    action, k, S = decision["action"], decision["k"], decision["S"]
    head = {
        "do_not_ship": f"Do not ship {OPTION} beyond staleness 0 on run {plain(run)}: ",
        "ship_up_to": f"Ship {OPTION} on run {plain(run)} only with {KEY} <= {k}, not {S}: ",
        "undecided": f"Cannot tell yet whether to ship {OPTION} on run {plain(run)} up to staleness {S}: ",
        "ship": f"Ship {OPTION} on run {plain(run)} with {KEY} up to {S}: ",
    }[action]
    floor, floor_fails = floor_parts(db, files, run)
    fails = floor_fails or action in ("do_not_ship", "ship_up_to")
    said = [f"**Decision on run {plain(run)}**: {head}", *floor]
    if decision["reason"] is not None:
        s, figure, excess = decision["reason"]
        said.append(f"at staleness {s} it {SAYS[figure].format(percent(*excess, 'family-wise 95%'))} beyond")
    if action == "do_not_ship":
        said.append(f"Keep the recompute (AReaL actor.prox_logp_method: recompute), or set {KEY}: 0.")
    return [
        *said,
        f"**Gate {'FAILED' if fails else 'passed with warnings'}** on this run (the default thresholds, "
        "schemas/default_thresholds.toml;",
        f"Judged at each staleness 1 to **{S}**, the staleness the trainer runs (",
    ]


@pytest.mark.parametrize("store", ["engine", "fixture"])
def test_the_banner_says_the_decision(store, engine_store, fixture_store, monkeypatch):
    """A run whose engine floor fails (synthetic) and a real run whose floor does not (the fixture's first
    30 steps of SmolLM2): the banner opens the page with the decision, then the floor's own verdict."""
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
    action = decision_of(db, tuple(files), run)["action"]
    box = {"do_not_ship": at.error, "ship": at.success}.get(action, at.warning)
    assert text in [b.value for b in box]  # the box says how it went
    loss = Loss.from_dict(
        json.loads(table(db, "SELECT value FROM store_meta WHERE key = 'loss'", [])["value"][0])
    )
    named = plain("proxaudit default: token PPO, clip 0.2, behaviour weight masked above 5")
    assert loss == DEFAULT_LOSS and f"replayed under: {plain(loss.describe())} ({named})." in text
    advice = "Fix the engine's precision before blaming the approximation."
    assert (advice in text) == (store == "engine")  # its floor's point estimates are over the tolerance
    checks = frame_with(at, "requirement")
    assert not checks.isna().any().any()  # no None cell: a check without a method says what it judges
    assert list(checks.columns[:2]) == ["verdict", "requirement"]  # each requirement beside its verdict
    assert list(checks["verdict"]) == sorted(checks["verdict"], key=["fail", "warn", "pass", "skip"].index)


def test_the_overview_opens_on_the_worst_run(fixture_store, monkeypatch):
    """Without a run in the link, the worst decision first: do not ship, cannot tell, ship up to, ship;
    then the largest figure."""
    order = ("do_not_ship", "undecided", "ship_up_to", "ship")
    decided = {
        run: decision_of(fixture_store, tuple(fixture_logs(run)), run) for run in ("loglinear", "recompute")
    }

    def rank(run: str) -> tuple[int, float]:
        reason = decided[run]["reason"]
        return order.index(decided[run]["action"]), -(reason[2][0] if reason else 0.0)

    worst = min(decided, key=rank)
    at = run_app(fixture_store, monkeypatch, page="overview")
    no_exception(at)
    assert at.sidebar.selectbox(key="run").value == worst
    assert f"**Decision on run {plain(worst)}**" in banner(at)


def test_the_banner_names_the_thresholds_and_what_they_decide(fixture_store, tmp_path, monkeypatch):
    gate = tmp_path / "gate.toml"
    gate.write_text('[[check]]\nname = "loglinear within 50%"\nmethod = "loglinear"\nfigure = '
                    '"gradient_mass_error"\nmax = 0.5\n')  # fmt: skip
    at = run_app(fixture_store, monkeypatch, page="overview", run="loglinear", thresholds=gate)
    no_exception(at)
    text = banner(at)
    assert (
        f"**Gate passed** on this run (thresholds {plain('gate.toml')}): 0 checks fail, 0 warn, 1 pass."
        in text
    )
    files = fixture_logs("loglinear")
    values = values_of(tuple(files))
    gme = decision_figures(values, ["run_id"]).loc[("loglinear", "loglinear"), "gradient_mass_error"]
    lower, upper = intervals(fixture_store, "loglinear").loc[
        (-1, "loglinear", "gradient_mass_error"), ["lower", "upper"]
    ]
    tokens = loss_tokens(files)
    with_truth = tokens[tokens["prox_logp"].notna()]["staleness"].value_counts()
    top = int(with_truth[with_truth >= 1000].index.max())
    assert (
        f"**Decision on run {plain('loglinear')}**: Ship loglinear on run {plain('loglinear')} with "
        f"{KEY} up to {top}: every staleness 1-{top} passes; the closest: it moves "
        f"{percent(gme, lower, upper)} of the gradient mass (tolerance 50%)."
    ) in text  # loglinear is no trainer's option: no setting named
    gate.write_text("[[check]]\nmethod = 'no_such_method'\n")
    at = run_app(fixture_store, monkeypatch, page="overview", run="loglinear", thresholds=gate)
    no_exception(at)
    text = banner(at)
    assert (
        f"**Decision on run {plain('loglinear')}: cannot judge** (thresholds {plain('gate.toml')}): " in text
    )
    floor, _ = floor_parts(fixture_store, files, "loglinear")
    assert floor[0] in text  # the engine floor's verdict still stands


def test_compare_lists_the_decision_figures_with_intervals(fixture_store, monkeypatch):
    at = run_app(fixture_store, monkeypatch, page="compare", run="recompute", A_method="loglinear_shipped",
                 B_run="loglinear", B_method="loglinear_shipped")  # fmt: skip
    no_exception(at)
    figures = frame_with(at, "gradient_mass_error 95%")
    names = ["A: recompute / loglinear_shipped", "B: loglinear / loglinear_shipped"]
    assert list(figures.index) == names
    for name, run in zip(names, ("recompute", "loglinear"), strict=True):
        want = decision_figures(values_of(tuple(fixture_logs(run))), ["run_id"]).loc[
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
        values_of(tuple(f)).query("method == 'loglinear_shipped' and metric == 'abs_error'")["value"]
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
