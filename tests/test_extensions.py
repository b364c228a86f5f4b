"""The DuckDB extensions a store needs (`evaluator.store.lake.load`): DuckDB checks each file's signature the
first time a process loads it, and again whenever the file changed since; the connections that load them
without checking load only files checked so; a reader's connection loads nothing at all."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest

from evaluator.logio import write_log_atomic
from evaluator.replay.pipeline import replay
from evaluator.store import lake, open_store
from evaluator.store.lake import check_signature, extension_path
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps


@pytest.fixture
def copied(tmp_path) -> Path:
    """A copy of the sqlite_scanner extension, DuckDB's signature and all."""
    copy = tmp_path / "sqlite_scanner.duckdb_extension"
    shutil.copyfile(extension_path("sqlite_scanner"), copy)
    return copy


def tamper(path: Path) -> None:
    """One byte of the binary changed in place (its signature no longer holds)."""
    with open(path, "r+b") as binary:
        binary.seek(path.stat().st_size // 2)
        byte = binary.read(1)
        binary.seek(-1, 1)
        binary.write(bytes([byte[0] ^ 0xFF]))


def test_a_file_without_duckdb_s_signature_is_refused(copied):
    tamper(copied)
    with pytest.raises(duckdb.Error, match="signature"):
        check_signature(copied)


def test_a_file_checked_once_is_checked_again_once_it_changed(copied, monkeypatch):
    checks = []
    real = lake.connect
    monkeypatch.setattr(lake, "connect", lambda *a, **k: checks.append(1) or real(*a, **k))
    check_signature(copied)
    check_signature(copied)
    assert len(checks) == 1  # unchanged: checked once in the process
    tamper(copied)
    with pytest.raises(duckdb.Error, match="signature"):
        check_signature(copied)
    assert len(checks) == 2


def test_the_store_s_connections_load_their_extensions_checked_and_a_reader_loads_nothing(tmp_path):
    spec = SyntheticSpec(run_id="r", tokens_per_step=256, mean_length=16)
    log = write_log_atomic(synthetic_steps(spec, 0, 2), tmp_path / "r.parquet")
    replay([log], tmp_path / "m", progress=False)
    assert {extension_path(name) for name in ("sqlite_scanner", "ducklake")} <= set(lake._SIGNATURE_CHECKED)
    unsigned = tmp_path / "httpfs.duckdb_extension"  # an extension a folder store's reader has not loaded
    shutil.copyfile(extension_path("httpfs"), unsigned)
    tamper(unsigned)
    with (
        open_store(tmp_path / "m") as con,
        pytest.raises(duckdb.Error, match="disabled through configuration"),
    ):
        con.execute(f"LOAD '{unsigned}'")
