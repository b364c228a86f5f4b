"""A store whose catalog is PostgreSQL (several machines write one store): two replays at once end in the
store a clean replay into a folder store gives, table by table. A throwaway PostgreSQL cluster is started
on a Unix socket under the test's folder (Debian's `postgresql`; skipped where it is not installed)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from evaluator.replay.pipeline import replay
from evaluator.store import StoreWriter
from tests.test_store_writers import assert_same_store, cli_replay, write_logs

pytest.importorskip(
    "duckdb_extension_postgres_scanner", reason="needs proxaudit[scale] (make install has it)"
)
BIN = Path("/usr/lib/postgresql/15/bin")


def _tool(name: str) -> str | None:
    return str(BIN / name) if (BIN / name).exists() else shutil.which(name)


@pytest.fixture(scope="module")
def postgres():
    """A PostgreSQL cluster of this test module (in a folder of /tmp the postgres user can reach): (the
    catalog URL, its folder)."""
    initdb, pg_ctl = _tool("initdb"), _tool("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    folder = Path(tempfile.mkdtemp(prefix="proxaudit-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root: as the postgres user
        if (
            shutil.which("runuser") is None
            or subprocess.run(["id", "postgres"], capture_output=True).returncode
        ):
            pytest.skip("running as root without a postgres user to start PostgreSQL as")
        shutil.chown(folder, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    data = folder / "cluster"
    subprocess.run([*as_user, initdb, "-D", str(data), "-A", "trust", "-U", "postgres"], check=True,
                   capture_output=True)  # fmt: skip
    options = f"-p {port} -k {folder} -c listen_addresses=''"
    start = [pg_ctl, "-D", str(data), "-o", options, "-w", "start", "-l", str(folder / "log")]
    subprocess.run([*as_user, *start], check=True, capture_output=True)
    try:
        yield f"postgres:dbname=postgres host={folder} port={port} user=postgres", folder
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def test_two_replays_into_a_postgres_catalog_equal_a_clean_replay(postgres, tmp_path):
    url, folder = postgres
    logs = write_logs(tmp_path / "logs")
    clean = tmp_path / "clean"
    replay(logs, clean, progress=False, workers=1)
    data = tmp_path / "data"
    with StoreWriter(url, data_path=str(data) + os.sep):  # the store made first, then written at once
        pass
    writers = [cli_replay(logs, url, data_path=data), cli_replay(logs[::-1], url, data_path=data)]
    outputs = [w.communicate(timeout=600) for w in writers]
    assert [w.returncode for w in writers] == [0, 0], [err for _, err in outputs]
    ingested = sum(out.count(": ingested (") for out, _ in outputs)
    assert ingested == len(logs)  # each file once, whichever replay took it
    assert_same_store(url, clean)
    assert list(data.rglob("*.parquet"))  # the data files went to the data path
