"""Shared pytest fixtures."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"

# The commands' output is tested as a pipe receives it (no width); pytest-xdist's workers set COLUMNS=80,
# which `terminal_width` would wrap every table and sentence at. Tests that need a width set their own.
os.environ.pop("COLUMNS", None)


@pytest.fixture(autouse=True, scope="session")
def streamlit_components_scanned_once():
    """Each new `AppTest` scans the metadata of every installed distribution for Streamlit components
    (streamlit.components.v2.manifest_scanner: about 0.8 s of CPU, half a small page's render); the installed
    packages do not change while the tests run, so a session scans once. Only where a collected test module
    imported Streamlit (the AppTest tests): no other session imports it."""
    if "streamlit" not in sys.modules:
        yield
        return
    from streamlit.components.v2 import manifest_scanner

    scanned = functools.cache(manifest_scanner.scan_component_manifests)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(manifest_scanner, "scan_component_manifests", lambda *args: list(scanned(*args)))
        yield


@pytest.fixture(autouse=True, scope="session")
def checked_records_of_this_session(tmp_path_factory):
    """The records of checked snapshots (`evaluator.store.checked_record`) in a folder of the session, not
    the user's cache; the tests' subprocesses inherit it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PROXAUDIT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture
def repo_root() -> Path:
    return REPO


# Metrics stores for the dashboard tests (session-wide; tests only read them).
@pytest.fixture(scope="session")
def fixture_store(tmp_path_factory) -> Path:
    """The first 30 steps of both fixture runs (`recompute`, `loglinear`) replayed into a store."""
    from evaluator.replay.pipeline import replay

    db = tmp_path_factory.mktemp("fixture_store") / "metrics"
    files = [p for run in ("recompute", "loglinear") for p in sorted(FIXTURES.glob(f"{run}-*.parquet"))[:3]]
    assert len(files) == 6, "fixtures/*.parquet missing"
    replay(files, db, progress=False)
    return db


@pytest.fixture(scope="session")
def one_step_store(tmp_path_factory) -> Path:
    """One run with a single step (synthetic, staleness 0..8), replayed into a store."""
    from evaluator.logio import write_log_atomic
    from evaluator.replay.pipeline import replay
    from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps

    folder = tmp_path_factory.mktemp("one_step_store")
    log = write_log_atomic(synthetic_steps(SyntheticSpec(run_id="one-step", tokens_per_step=2048), 8, 1),
                           folder / "one-step.parquet")  # fmt: skip
    replay([log], folder / "metrics", progress=False)
    return folder / "metrics"


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory) -> Path:
    """A store with the schema and no runs (what a replay of no clean file leaves)."""
    from evaluator.store import StoreWriter

    db = tmp_path_factory.mktemp("empty_store") / "metrics"
    with StoreWriter(db):
        pass
    return db
