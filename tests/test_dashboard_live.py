"""The Live audit page through `AppTest`: the decision over the store's commits (DuckLake time travel)
against stores replayed separately from the files each commit had, the commit the page is as of, and
watch's alerts."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from evaluator.cli.serve import APP
from evaluator.logio import write_log_atomic
from evaluator.replay import replay
from evaluator.store import connect_store
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps
from evaluator.verdict import judge_db
from evaluator.watch.alerts import Alert
from evaluator.watch.sinks import AlertsFile

RUN, OTHER = "live-run", "other-run"
STEPS_PER_FILE = 8


def _log(folder: Path, spec: SyntheticSpec, part: int) -> Path:
    table = synthetic_steps(spec, 10 + part * STEPS_PER_FILE, STEPS_PER_FILE)
    return write_log_atomic(table, folder / f"{spec.run_id}-{part}.parquet")


@pytest.fixture(scope="module")
def grown(tmp_path_factory) -> tuple[Path, list[Path]]:
    """A store filled as a live run grows: three files of RUN, each replayed on its own, with a file of
    another run between the second and the third."""
    folder = tmp_path_factory.mktemp("live")
    spec = SyntheticSpec(run_id=RUN, tokens_per_step=2048, drift=0.3)
    files = [_log(folder, spec, part) for part in range(3)]
    other = _log(folder, SyntheticSpec(run_id=OTHER, tokens_per_step=256), 0)
    db = folder / "store"
    for path in (files[0], files[1], other, files[2]):
        replay([path], db, progress=False)
    return db, files


def run_live(db: Path, monkeypatch, alerts: Path | None = None) -> AppTest:
    monkeypatch.setenv("PROXAUDIT_DB", str(db))
    monkeypatch.delenv("PROXAUDIT_THRESHOLDS", raising=False)
    if alerts is None:
        monkeypatch.delenv("PROXAUDIT_ALERTS", raising=False)
    else:
        monkeypatch.setenv("PROXAUDIT_ALERTS", str(alerts))
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.query_params.update(page="live", run=RUN)
    at = at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def table(at: AppTest, column: str):
    return next(f.value for f in at.dataframe if column in f.value.columns)


def test_the_history_is_the_decision_of_each_store_the_run_grew_through(grown, monkeypatch, tmp_path):
    """One row per replay that brought a file of the run (the other run's commit is not one of them), each
    the decision `gate` gives on a store replayed separately from the run's files up to then."""
    db, files = grown
    at = run_live(db, monkeypatch)
    history = table(at, "snapshot_id").iloc[::-1].reset_index(drop=True)  # the page shows newest first
    assert len(history) == len(files)
    assert history["snapshot_id"].is_monotonic_increasing
    for n, row in history.iterrows():
        separate = tmp_path / f"first-{n + 1}"
        replay(files[: n + 1], separate, progress=False, workers=1)  # in this process: no workers to start
        (expected,) = judge_db(separate, run=RUN).decisions
        assert (row["action"], row["max_staleness"]) == (expected.action, expected.max_staleness), n
        assert expected.reason is not None and expected.reason.observed is not None, expected
        assert row["figure"] == expected.reason.measure
        for column in ("value", "lower", "upper"):
            value = getattr(expected.reason.observed, column)
            assert row[column] == pytest.approx(value, rel=1e-9, abs=1e-12), (n, column)
    assert len(at.get("plotly_chart")) == 1


def test_the_page_says_which_commit_it_is_as_of(grown, monkeypatch):
    db, _ = grown
    with connect_store(db) as con:
        latest = con.execute("SELECT id FROM store.current_snapshot()").fetchone()[0]
    at = run_live(db, monkeypatch)
    captions = [c.value for c in at.sidebar.caption]
    assert any(c.startswith(f"as of commit {latest}, ") and c.endswith(" s ago") for c in captions), captions


def test_the_alerts_of_the_run_and_the_folders_newest_first(grown, monkeypatch, tmp_path):
    db, _ = grown
    path = tmp_path / "alerts.jsonl"
    sink = AlertsFile(path)
    written = [
        Alert("2025-01-01T00:00:01Z", RUN, "verdict", "undecided", None, "too few steps"),
        Alert("2025-01-01T00:00:02Z", OTHER, "verdict", "ship", None, "every check passes"),
        Alert("2025-01-01T00:00:03Z", RUN, "verdict", "do_not_ship", "undecided", "[x](https://e.example)"),
        Alert("2025-01-01T00:00:04Z", None, "idle", "idle", "active", "no file changed for 600 s"),
    ]
    for alert in written:
        sink.append(alert)
    shown = table(run_live(db, monkeypatch, path), "reason")
    expected = [a for a in reversed(written) if a.run_id in (RUN, None)]
    assert list(shown["time"]) == [a.time for a in expected]
    assert list(shown["state"]) == [a.state for a in expected]
    assert list(shown["reason"]) == [a.reason for a in expected]  # as written: a table cell is never Markdown


def test_without_an_alerts_file_the_page_says_how_to_give_one(grown, monkeypatch):
    at = run_live(grown[0], monkeypatch)
    assert any("--alerts FILE" in str(i.value) for i in at.info)
