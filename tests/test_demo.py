"""`proxaudit demo --no-serve`: the whole pipeline on the bundled fixtures, as `make demo` runs it."""

from __future__ import annotations

import json
import re
import socket

from click.testing import CliRunner

from evaluator.cli import cli
from evaluator.demo import FIXTURES
from evaluator.store import connect_store


def test_demo_runs_the_pipeline_on_the_fixtures_afresh_each_time(tmp_path):
    runner = CliRunner()
    assert runner.invoke(cli, ["demo", "--no-serve", "--out", str(tmp_path)]).exit_code == 0
    result = runner.invoke(  # a second run: no double count; judged at the trainer's staleness 3
        cli, ["demo", "--no-serve", "--out", str(tmp_path), "--max-staleness", "3"]
    )
    assert result.exit_code == 0, result.output
    out = result.output
    for stage in ("== validate", "== replay", "== the decision", "== summary", "== gate"):
        assert stage in out
    assert out.index("== the decision") < out.index("== summary")  # a decision first
    header = next(line for line in out.splitlines() if line.startswith("== validate"))
    n_files = len(list(FIXTURES.glob("*.parquet")))
    assert header.startswith(f"== validate: {n_files} files in {FIXTURES} ") and ".parquet" not in header
    assert "0 with problems, 0 unreadable" in out
    assert "gate FAILED" in out  # the verdict is shown, not the exit code: recompute fails a staleness
    decided = out[out.index("== the decision") : out.index("== summary")].splitlines()
    lines = [line for line in decided if line.startswith("- ")]  # one sentence per run, then its floor
    assert len(lines) == 2 and all("Engine floor of run" in line for line in lines)
    assert "on run loglinear up to staleness 3: " in lines[0] and " 1-3 each " in out
    assert lines[1].startswith(
        "- Do not ship loglinear_shipped (AReaL actor.prox_logp_method: loglinear) beyond staleness 0 on run "
        "recompute: at staleness "
    )
    with connect_store(tmp_path / "store") as con:
        runs = {r[0] for r in con.execute("SELECT DISTINCT run_id FROM run_summary").fetchall()}
        files = con.execute("SELECT count(*) FROM ingested_file").fetchone()[0]
        recorded = con.execute("SELECT value FROM store_meta WHERE key = 'max_staleness'").fetchone()[0]
    assert json.loads(recorded)["value"] == 3  # with the store: the dashboard it serves judges the same
    assert runs == {"recompute", "loglinear"}
    assert files == len(list(FIXTURES.glob("*.parquet")))


def test_a_busy_port_is_refused_before_the_pipeline_runs(tmp_path, empty_store):
    """`demo` (which serves by default) and `dashboard` check the port first: exit 2, the next free port
    suggested, and not a minute of pipeline before the server fails to start."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = tmp_path / "out"
        result = CliRunner().invoke(cli, ["demo", "--out", str(out), "--port", str(port)])
        served = CliRunner().invoke(cli, ["dashboard", "--db", str(empty_store), "--port", str(port)])
    assert result.exit_code == 2, result.output
    assert "== validate" not in result.output and not out.exists()
    found = re.search(rf"port {port} on 127\.0\.0\.1 is in use .*e\.g\. --port (\d+)", result.output)
    assert found and int(found[1]) != port, result.output
    with socket.socket() as probe:  # the suggested port is free
        probe.bind(("127.0.0.1", int(found[1])))
    assert served.exit_code == 2 and f"port {port} on 127.0.0.1 is in use" in served.output
