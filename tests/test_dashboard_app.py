"""The Streamlit app through `AppTest`: every page on the fixture, one-step and empty stores, the filters
that change what is read, URL state, a busy database, the gate verdict, and that nothing is written."""

from __future__ import annotations

import hashlib
import re
import socketserver
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from streamlit.testing.v1 import AppTest

from dashboard.views import PAGES
from dashboard.views.common import plain
from evaluator.cli.serve import APP
from evaluator.store import connect_store
from schemas.store import METHODS
from schemas.thresholds import DEFAULT_THRESHOLDS
from tests.conftest import FIXTURES
from tests.reference import (
    QUANTILE_PERCENT,
    decision_figures,
    loss_tokens,
    promised_value,
    reference_values,
    safe_staleness,
    within_promise,
)

# Plotly charts each page draws on a store with both version conventions and raw logs reachable.
CHARTS = {"overview": 4, "drift": 5, "weights": 3, "training": 3, "compare": 2, "tokens": 1, "live": 1}


def run_app(
    db: Path | None, monkeypatch, timeout: float = 60, thresholds: Path | None = None, **params: str
) -> AppTest:
    """The app on `db`, started with `--thresholds` (as `proxaudit dashboard` passes it) and URL `params`."""
    if db is None:
        monkeypatch.delenv("PROXAUDIT_DB", raising=False)
    else:
        monkeypatch.setenv("PROXAUDIT_DB", str(db))
    if thresholds is None:
        monkeypatch.delenv("PROXAUDIT_THRESHOLDS", raising=False)
    else:
        monkeypatch.setenv("PROXAUDIT_THRESHOLDS", str(thresholds))
    at = AppTest.from_file(str(APP), default_timeout=timeout)
    at.query_params.update(params)
    return at.run()


def no_exception(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def texts(at: AppTest) -> str:
    parts = [*at.markdown, *at.caption, *at.info, *at.warning, *at.error, *at.success]
    return "\n".join(str(p.value) for p in parts)


def frame_with(at: AppTest, column: str):
    """The first dataframe on the page that has `column`."""
    return next(f.value for f in at.dataframe if column in f.value.columns)


def digest(store: Path) -> tuple[str, str]:
    """The bytes of a store's data files and its catalog's content (SQLite may checkpoint its WAL into the
    catalog file when the last reader closes: the same rows in other bytes)."""
    from tests.test_store_writers import tables

    h = hashlib.blake2b()
    for path in sorted((store / "data").rglob("*.parquet")):
        h.update(str(path.relative_to(store)).encode() + path.read_bytes())
    return h.hexdigest(), repr(tables(store))


@pytest.mark.parametrize("page", list(PAGES))
def test_every_page_on_the_fixture_runs(fixture_store, monkeypatch, page):
    at = run_app(fixture_store, monkeypatch, page=page, run="recompute")
    no_exception(at)
    assert at.title[0].value == PAGES[page][0]
    assert len(at.get("plotly_chart")) == CHARTS[page]
    assert not at.error


def fixture_logs(run: str) -> list[Path]:
    """The token logs of `run` in the fixture store (its first 3 files: conftest.fixture_store)."""
    return sorted(FIXTURES.glob(f"{run}-*.parquet"))[:3]


def test_overview_numbers(fixture_store, monkeypatch):
    """The Overview's figures against DOMAIN.md computed in numpy over the run's token logs, not against
    the query functions the page calls; every method chosen."""
    at = run_app(fixture_store, monkeypatch, page="overview", run="loglinear", methods=",".join(METHODS[1:]))
    tokens = loss_tokens(fixture_logs("loglinear"))
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["runs in the store"] == "2"
    assert metrics["tokens (loss_mask)"] == f"{len(tokens):,}"
    assert metrics["steps"] == str(tokens["step"].nunique()) == "30"
    assert metrics["with prox_logp"] == f"{tokens['prox_logp'].notna().mean():.0%}" == "50%"  # even steps
    values = reference_values(fixture_logs("loglinear"))
    headline = frame_with(at, "abs_error p99")
    assert set(headline.index) == set(METHODS) - {"ground_truth"}
    for method, row in headline.iterrows():
        errors = values.query("method == @method and metric == 'abs_error'")["value"].to_numpy()
        assert row["tokens"] == len(errors)
        assert row["abs_error mean"] == pytest.approx(errors.mean(), rel=1e-9)
        assert row["abs_error max"] == pytest.approx(errors.max(), rel=1e-12)
        for stat in QUANTILE_PERCENT:
            assert within_promise(row[f"abs_error {stat}"], promised_value(errors, stat)), (method, stat)
    decision = frame_with(at, "gradient_mass_error")  # the decision, after the banner's gate checks
    expected = decision_figures(values, ["run_id"]).droplevel("run_id")
    levels = decision_figures(values, ["staleness"]).reset_index()
    assert set(decision.index) == set(expected.index) == set(METHODS) - {"ground_truth"}
    for method, row in decision.iterrows():
        want = expected.loc[method]
        assert row["gradient_mass_error"] == pytest.approx(want["gradient_mass_error"], rel=1e-9)
        assert row["clip_flip_rate"] == pytest.approx(want["clip_flip_rate"], rel=1e-12)
        safe = safe_staleness(levels[levels["method"] == method], 0.01, 0.01, 1000)  # default tolerance
        assert row["safe_staleness"] == safe, method
    assert decision["safe_staleness"].nunique() > 1  # the methods differ: the check says something
    assert "May I ship this estimator?" in [h.value for h in at.subheader]
    # only what a trainer runs: reuse_train_logp is closest, but AReaL runs it with one minibatch (these runs
    # have two), and the *_exact methods, loglinear and linear are no trainer's option
    closest = next(m.value for m in at.markdown if "closest to the recomputed prox" in m.value)
    options = expected.loc[["loglinear_shipped", "rollout"], "gradient_mass_error"]
    assert f"**{options.idxmin()}** (" in closest and "reuse_train_logp" not in closest
    assert "Engine floor of run" in texts(at)
    assert "True drift" in texts(at)
    assert "loglinear_shipped" in texts(at) and "Compare AReaL's own logged" in texts(at)


def test_filters_narrow_the_data_and_go_into_the_url(fixture_store, monkeypatch):
    at = run_app(fixture_store, monkeypatch, page="drift", run="recompute")
    at.sidebar.multiselect(key="methods").set_value(["loglinear", "linear_exact"])
    at.sidebar.slider(key="staleness").set_value((1, 3))
    at.run()
    no_exception(at)
    table = at.dataframe[0].value  # rows staleness, columns (method, stat)
    assert list(table.index) == [1, 2, 3]
    assert set(table.columns.get_level_values(0)) == {"loglinear", "linear_exact"}
    assert at.query_params["staleness"] == "1-3"
    assert at.query_params["methods"] == "loglinear,linear_exact"
    at.sidebar.slider(key="steps").set_value((10, 20))
    at.run()
    no_exception(at)
    assert "Step range selected" in texts(at)
    assert at.dataframe[0].value.columns.get_level_values(1).tolist().count("p50") == 0  # moments only
    assert at.query_params["steps"] == "10-20"


def test_the_charts_open_on_the_gated_method_and_arealss_options(fixture_store, monkeypatch, tmp_path):
    """By default the pages draw the method the thresholds gate (the default ones: loglinear_shipped) and
    what AReaL offers (areal/utils/constants.py's ProxApproxMethod: loglinear and linear as its code
    computes them, and rollout); a thresholds file gating another method adds it; the rest is one click
    away in the sidebar."""
    import tomllib

    areal = {"loglinear_shipped", "linear_shipped", "rollout"}
    gated = {c["method"] for c in tomllib.loads(DEFAULT_THRESHOLDS.read_text())["check"] if "method" in c}
    at = run_app(fixture_store, monkeypatch, page="drift", run="recompute")
    no_exception(at)
    picker = at.sidebar.multiselect(key="methods")
    assert set(picker.value) == areal | gated == areal
    assert set(picker.options) == set(METHODS) - {"ground_truth"}
    assert set(at.dataframe[0].value.columns.get_level_values(0)) == areal
    own = tmp_path / "gate.toml"
    own.write_text('[[check]]\nmethod = "loglinear_exact"\nmetric = "abs_error"\nstat = "mean"\nmax = 1\n')
    at = run_app(fixture_store, monkeypatch, page="drift", run="recompute", thresholds=own)
    assert set(at.sidebar.multiselect(key="methods").value) == areal | {"loglinear_exact"}


def test_no_method_chosen_means_every_estimator(fixture_store, monkeypatch):
    at = run_app(fixture_store, monkeypatch, page="drift", run="recompute")
    at.sidebar.multiselect(key="methods").set_value([]).run()
    no_exception(at)
    assert "No method chosen" in at.sidebar.caption[0].value
    assert set(at.dataframe[0].value.columns.get_level_values(0)) == set(METHODS) - {"ground_truth"}


def test_url_state_is_restored_and_bad_values_fall_back(fixture_store, monkeypatch):
    at = run_app(fixture_store, monkeypatch, page="compare", run="nope", A_method="linear", B_run="loglinear",
                 metric="abs_error", steps="25-99")  # fmt: skip
    no_exception(at)
    # unknown run: the worst one (recompute; test_dashboard_verdict.py derives which from the logs)
    assert at.sidebar.selectbox(key="run").value == "recompute"
    assert at.sidebar.slider(key="steps").value == (25, 29)  # clamped to the run's steps
    assert at.selectbox(key="A_method").value == "linear"
    assert at.selectbox(key="B_run").value == "loglinear"
    assert at.selectbox(key="metric").value == "abs_error"
    table = frame_with(at, "B / A")  # rows: the statistics; columns: A, B and B / A, as text
    assert list(table.columns) == ["A: recompute / linear", "B: loglinear / loglinear", "B / A"]
    a, b = (float(table.loc["mean"].iloc[i]) for i in (0, 1))
    assert float(table.loc["mean", "B / A"]) == pytest.approx(b / a, rel=1e-3)
    at.selectbox(key="metric").set_value("drift").run()
    no_exception(at)
    assert plain("A: recompute / linear") + ": no drift rows" in at.info[0].value


def test_the_run_to_open_on_is_judged_only_when_it_must_be(
    one_step_store, fixture_store, tmp_path, monkeypatch
):
    """Without a run in the link, the app opens on the worst run, which runs the gate over every run of the
    store: never when the link names a run, nor when the store has only one. (A thresholds file of this
    test's own: a gate no earlier page has run and cached.)"""
    from dashboard import queries

    def judgement(*args, **kwargs):
        raise AssertionError("the gate ran")

    monkeypatch.setattr(queries, "judgement", judgement)
    gate = tmp_path / "gate.toml"
    gate.write_text(DEFAULT_THRESHOLDS.read_text())
    for store, params in ((one_step_store, {}), (fixture_store, {"run": "loglinear"})):
        at = run_app(store, monkeypatch, thresholds=gate, page="tokens", **params)
        no_exception(at)
        assert at.title[0].value == PAGES["tokens"][0]


def test_every_page_on_one_run_with_one_step(one_step_store, monkeypatch):
    for page in PAGES:
        at = run_app(one_step_store, monkeypatch, page=page)
        no_exception(at)
        assert len(at.get("plotly_chart")) == CHARTS[page], page
        assert "step: 8 (the only value)" in [c.value for c in at.sidebar.caption]


def test_run_without_ground_truth(tmp_path, monkeypatch):
    from evaluator.logio import write_log_atomic
    from evaluator.replay.pipeline import replay
    from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps

    spec = SyntheticSpec(run_id="no-prox", prox_every=0, with_proximal_t=False)
    replay([write_log_atomic(synthetic_steps(spec, 8, 2), tmp_path / "p.parquet")], tmp_path / "m")
    for page in PAGES:
        at = run_app(tmp_path / "m", monkeypatch, page=page)
        no_exception(at)
        # the Overview's decision charts need the ground truth: it says so instead
        assert len(at.get("plotly_chart")) == CHARTS[page] - 2 * (page == "overview"), page
        if page in ("drift", "training"):
            assert "has no prox_logp" in at.info[0].value
        if page == "overview":
            assert "did not record" in at.info[0].value


def test_empty_store_explains_how_to_fill_it(empty_store, monkeypatch):
    for page in PAGES:
        at = run_app(empty_store, monkeypatch, page=page)
        no_exception(at)
        assert "proxaudit replay LOGS --db" in at.info[0].value
        assert not at.get("plotly_chart")


def test_missing_or_foreign_database_is_a_message(tmp_path, monkeypatch):
    at = run_app(tmp_path / "nope", monkeypatch)
    no_exception(at)
    assert "no metrics store at" in at.error[0].value
    at = run_app(None, monkeypatch)
    assert "proxaudit dashboard --db" in at.error[0].value
    (tmp_path / "junk.duckdb").write_bytes(b"not a database at all" * 100)
    at = run_app(tmp_path / "junk.duckdb", monkeypatch)
    no_exception(at)
    assert "a file, not a store folder" in at.error[0].value


def test_token_inspector_when_the_raw_log_moved(tmp_path, monkeypatch):
    from evaluator.logio import write_log_atomic
    from evaluator.replay.pipeline import replay
    from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps

    log = write_log_atomic(synthetic_steps(SyntheticSpec(run_id="moved"), 3, 1), tmp_path / "moved.parquet")
    replay([log], tmp_path / "m", progress=False)
    log.rename(tmp_path / "elsewhere.parquet")
    at = run_app(tmp_path / "m", monkeypatch, page="tokens")
    no_exception(at)
    assert "not reachable" in at.warning[0].value and plain(log) in at.warning[0].value


def test_token_inspector_shows_the_chosen_sequence(fixture_store, monkeypatch):
    """The inspector shows every row of the chosen sequence of the step, read back from the raw log."""
    rows = pd.concat([pq.read_table(f).to_pandas() for f in fixture_logs("recompute")])
    rows = rows[rows["step"] == 12]
    seq_id = int(rows["seq_id"].max())
    rows = rows[rows["seq_id"] == seq_id].sort_values(["minibatch", "pos"])
    at = run_app(fixture_store, monkeypatch, page="tokens", run="recompute", step="12", seq=str(seq_id))
    no_exception(at)
    assert at.selectbox(key="seq").value == seq_id
    tokens = at.dataframe[0].value
    assert len(tokens) == len(rows) > 1
    for column in ("pos", "behave_logp", "prox_logp", "theta_logp", "proximal_t_logp", "behave_version"):
        np.testing.assert_array_equal(tokens[column].to_numpy(), rows[column].to_numpy(), err_msg=column)


def test_gate_verdict_on_the_overview(fixture_store, tmp_path, monkeypatch):
    at = run_app(fixture_store, monkeypatch, page="overview", run="recompute", thresholds=DEFAULT_THRESHOLDS)
    no_exception(at)
    verdict = [*at.success, *at.warning, *at.error]
    assert verdict and "Gate" in verdict[0].value and "recompute" in verdict[0].value
    assert {"requirement", "verdict", "observed"} <= set(frame_with(at, "verdict").columns)
    bad = tmp_path / "bad.toml"
    bad.write_text("[[check]]\nmethod = 'no_such_method'\n")
    at = run_app(fixture_store, monkeypatch, page="overview", run="recompute", thresholds=bad)
    no_exception(at)
    said = at.warning[0].value
    assert f"**Decision on run {plain('recompute')}: cannot judge**" in said and plain("bad.toml") in said
    assert len(at.get("plotly_chart")) == CHARTS["overview"]  # the rest of the page still renders


def test_a_writer_holding_the_catalog_never_stops_a_page(one_step_store, monkeypatch):
    """The catalog is SQLite in WAL mode: while another process holds its write lock (a replay
    committing), every page reads the last commit, with no "busy" note."""
    from test_dashboard_queries import HOLD_LOCK

    pages = {"drift": {}, "overview": {"thresholds": DEFAULT_THRESHOLDS}}
    child = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(one_step_store / "catalog.sqlite")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout.readline().strip() == "locked"
        shown = {
            page: run_app(one_step_store, monkeypatch, page=page, **params) for page, params in pages.items()
        }
    finally:
        child.stdin.close()
        child.wait(timeout=60)
    for page, at in shown.items():
        no_exception(at)
        assert not any("busy" in i.value for i in at.info), page
        assert len(at.get("plotly_chart")) == CHARTS[page]


def test_the_app_never_writes(fixture_store, monkeypatch):
    before = digest(fixture_store)
    for page in PAGES:
        no_exception(run_app(fixture_store, monkeypatch, page=page, run="loglinear"))
    assert digest(fixture_store) == before


def test_over_training_worst_cell(fixture_store, monkeypatch):
    """The worst (step, staleness) cell of the true drift, among cells of 30 tokens or more, from the logs."""
    at = run_app(fixture_store, monkeypatch, page="training", run="recompute", focus="ground_truth")
    no_exception(at)
    tokens = loss_tokens(fixture_logs("recompute"))
    tokens["drift"] = (tokens["prox_logp"].astype(float) - tokens["behave_logp"].astype(float)).abs()
    cells = tokens.groupby(["step", "staleness"])["drift"].agg(["size", "mean"])
    (step, staleness), worst = next(cells[cells["size"] >= 30].sort_values("mean").iloc[::-1].iterrows())
    line = next(m.value for m in at.markdown if m.value.startswith("Worst cell"))
    assert f"step **{step}**, staleness **{staleness}**: mean drift **{worst['mean']:.4g}**" in line


class TestDashboardCommand:
    def test_missing_database_and_bad_options_exit_2(self, tmp_path, fixture_store):
        from click.testing import CliRunner

        from evaluator.cli import cli

        result = CliRunner().invoke(cli, ["dashboard", "--db", str(tmp_path / "nope")])
        assert result.exit_code == 2 and "no such metrics store" in result.output
        result = CliRunner().invoke(cli, ["dashboard", "--db", str(fixture_store), "--port", "70000"])
        assert result.exit_code == 2 and "'--port'" in result.output and "1<=x<=65535" in result.output
        result = CliRunner().invoke(
            cli, ["dashboard", "--db", str(fixture_store), "--thresholds", "nope.toml"]
        )
        assert result.exit_code == 2 and "nope.toml" in result.output

    def test_local_only_headless_and_no_usage_statistics(self, fixture_store):
        from evaluator.cli.serve import streamlit_command

        command = streamlit_command(fixture_store, "127.0.0.1", 8501)
        options = dict(zip(command[5::2], command[6::2], strict=False))
        assert options["--server.address"] == "127.0.0.1" and options["--server.headless"] == "true"
        assert options["--browser.gatherUsageStats"] == "false"
        assert command[-2:] == ["--db", str(fixture_store.resolve())]

    @pytest.mark.slow
    def test_serves_until_ctrl_c(self, fixture_store):
        import os
        import signal
        import socket
        import subprocess
        import sys
        import time
        import urllib.request

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        code = "from evaluator.cli import main; main()"
        args = [sys.executable, "-c", code, "dashboard", "--db", str(fixture_store), "--port", str(port)]
        child = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, start_new_session=True)
        try:
            assert child.stdout.readline().startswith(f"proxaudit dashboard: http://127.0.0.1:{port}")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(
                        f"http://127.0.0.1:{port}/_stcore/health", timeout=2
                    ) as reply:
                        if reply.status == 200:
                            break
                except OSError:
                    time.sleep(0.25)
            else:
                pytest.fail("the dashboard did not come up")
            os.killpg(child.pid, signal.SIGINT)  # Ctrl-C in the terminal reaches the whole group
            assert child.wait(timeout=30) == 0
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        with pytest.raises(ProcessLookupError):  # the streamlit server went with it: no process left
            os.killpg(child.pid, 0)


@pytest.mark.slow
def test_pages_while_replay_writes(tmp_path, monkeypatch):
    """A real `proxaudit replay` of six fixture files fills the store while pages are rendered over and
    over: never an exception or a lock error, and the new data shows up on the next run."""
    import subprocess
    import sys

    from conftest import FIXTURES

    db = tmp_path / "live"
    files = [
        str(p) for run in ("recompute", "loglinear") for p in sorted(FIXTURES.glob(f"{run}-*.parquet"))[:3]
    ]
    code = "from evaluator.cli import main; main()"
    command = [sys.executable, "-c", code, "replay", *files, "--db", str(db), "--no-progress"]
    replay = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    renders = 0
    try:
        while replay.poll() is None or renders == 0:
            for page in ("overview", "drift", "training"):
                at = run_app(db, monkeypatch, page=page)
                no_exception(at)
                assert "lock" not in texts(at).lower()
                renders += 1
    finally:
        replay.wait(timeout=120)
    assert replay.returncode == 0
    at = run_app(db, monkeypatch, page="overview")
    assert at.sidebar.selectbox(key="run").options == ["loglinear", "recompute"]
    assert renders > 3, renders
    print(f"{renders} page renders while replay wrote")


def test_overview_shows_the_runs_warnings(tmp_path, monkeypatch):
    """A run whose loss mask was rolled: replay stores the warning, the Overview leads with it."""
    import numpy as np

    from evaluator.logio import write_log_atomic
    from evaluator.replay.pipeline import replay
    from tests.builders import clean_table, sequence_index, where

    table = clean_table()
    _, starts, lengths = sequence_index(table)
    last = np.zeros(table.num_rows, bool)
    last[starts + lengths - 1] = True
    write_log_atomic(where(table, "loss_mask", last, False), tmp_path / "logs" / "a.parquet")
    replay([tmp_path / "logs"], tmp_path / "m", progress=False)
    at = run_app(tmp_path / "m", monkeypatch, page="overview")
    no_exception(at)
    # after the verdict banner
    assert f"1 data-driven warning about {plain('builder')}" in [w.value for w in at.warning][-1]
    shown = frame_with(at, "rule")
    assert shown["rule"].tolist() == ["loss_mask_edge"]
    assert shown["figure"].iloc[0] == 1.0 and shown["threshold"].iloc[0].startswith(">= 25%")
    assert (
        shown["examples"].iloc[0].startswith("step 8 seq_id ")
        and shown["what to check in the trainer"].iloc[0]
    )
    labels = [e.label for e in at.expander]
    assert f"{plain('loss_mask_edge')}: what was seen" in labels  # the rule is the store's data: a code span
    undecided = next(label for label in labels if "could not decide" in label)
    assert undecided.split()[0].isdigit() and "no alignment to test" in texts(at)
    clean = run_app(tmp_path / "m", monkeypatch, page="drift")
    assert not clean.warning  # the Overview only


class _Listener(socketserver.ThreadingTCPServer):
    """A TCP server on 127.0.0.1 that records every connection it accepts (HTTP, TLS, anything)."""

    daemon_threads = True

    def __init__(self) -> None:
        self.connections: list[bytes] = []
        super().__init__(("127.0.0.1", 0), socketserver.BaseRequestHandler)

    def verify_request(self, request, client_address) -> bool:
        request.settimeout(2)
        try:
            self.connections.append(request.recv(4096))  # e.g. b"HEAD /bucket/b.parquet ... Authorization"
        except OSError:
            self.connections.append(b"")
        return False


FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "AKIAFAKEKEYID0000000",
    "AWS_SECRET_ACCESS_KEY": "fake",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
CRAFTED = {
    "s3 endpoint option": "s3://bucket/b.parquet?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1",
    "s3 credentials, host": "s3://AKIA:secret@127.0.0.1:{port}/b.parquet?scheme=http",
    "gs endpoint option": "gs://bucket/b.parquet?endpoint_override=127.0.0.1:{port}&scheme=http&anonymous=true",
    "http": "http://127.0.0.1:{port}/b.parquet",
    "hdfs": "hdfs://127.0.0.1:{port}/b.parquet",
}


def test_a_crafted_store_never_makes_the_inspector_reach_the_network(tmp_path, monkeypatch):
    """A store is data a colleague can hand you: the file URI it records for the token inspector must
    never choose a host, a scheme, credentials or filesystem options. The user's (fake) AWS credentials
    are in the environment; nothing may connect to the listener each crafted URI names (one store, its
    recorded path rewritten for each)."""

    from evaluator.logio import write_log_atomic
    from evaluator.replay.pipeline import replay
    from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps

    log = write_log_atomic(synthetic_steps(SyntheticSpec(run_id="c"), 3, 1), tmp_path / "c.parquet")
    replay([log], tmp_path / "m", progress=False)
    for key, value in FAKE_AWS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    listener = _Listener()
    threading.Thread(target=listener.serve_forever, daemon=True).start()
    try:
        for name, uri in CRAFTED.items():
            with connect_store(tmp_path / "m", read_only=False) as con:
                con.execute(
                    "UPDATE ingested_file SET path = ?", [uri.format(port=listener.server_address[1])]
                )
            at = run_app(tmp_path / "m", monkeypatch, page="tokens", step="3")
            no_exception(at)
            assert "not reachable" in at.warning[0].value, name
            assert listener.connections == [], name
    finally:
        listener.shutdown()
        listener.server_close()
    assert listener.connections == []  # with any connection the listener was still reading when asked


HOSTILE = (
    "see https://evil.example/x www.evil.example a@evil.example <a href='https://evil.example'>x</a> "
    "[t](https://evil.example) ![i](https://evil.example/i.png) :red[**big**] $x$"
)


def outside_code(markdown: str) -> str:
    """The text of `markdown` outside its inline code spans (a run of backticks up to the same run), its
    backslash escapes resolved: what GitHub Markdown's autolinking then reads."""
    text = re.sub(r"(?<!`)(`+)(?!`).*?(?<!`)\1(?!`)", "", markdown, flags=re.S)
    return re.sub(r"\\(.)", r"\1", text)


def test_values_from_the_data_are_inert_text(tmp_path, monkeypatch):
    """A run_id and a file path that look like links, HTML, Markdown, an icon or a formula are shown as
    code spans on every page (never a link: GitHub Markdown autolinks a URL even with its characters
    escaped), and Plotly gets them HTML-escaped."""

    from evaluator.logio import write_log_atomic
    from evaluator.replay.pipeline import replay
    from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps

    spec = SyntheticSpec(run_id=HOSTILE, prox_every=0, with_proximal_t=False)  # the pages say why empty
    replay([write_log_atomic(synthetic_steps(spec, 8, 2), tmp_path / "h.parquet")], tmp_path / "m")
    with connect_store(tmp_path / "m", read_only=False) as con:
        con.execute("UPDATE ingested_file SET path = ?", [f"/nowhere/{HOSTILE}.parquet"])
    named = set()
    for page in PAGES:
        at = run_app(tmp_path / "m", monkeypatch, page=page)
        no_exception(at)
        shown = texts(at)
        assert "evil.example" not in outside_code(shown), page
        if HOSTILE in shown:  # inside a code span
            named.add(page)
        assert all("<a href" not in chart.proto.spec for chart in at.get("plotly_chart")), page
    assert {"overview", "drift", "compare", "tokens"} <= named
