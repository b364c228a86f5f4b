"""`python -m evaluator.bench.readers`: readers during a replay of many small files, in one run.

A folder of small token logs (the hook writes one per 10 steps; many ranks write many) is replayed into a
fresh store twice: alone, and with readers polling it (a plain read-only connection to the store,
`summary`, `gate`, the dashboard's query of its first page) from another process, a round every `--pause`
seconds. It prints
each reader's success rate, how far behind replay's reported files a raw reader was, and replay's wall
time with and without readers (the slowdown the readers cost it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evaluator.logio import write_log_atomic
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps

POLL = r"""
import json, sys, time
from pathlib import Path
from dashboard import queries
from evaluator.store import connect_store
from evaluator.gate.judge import run_gate
from evaluator.verdict.summary import summary_table
from schemas.thresholds import DEFAULT_THRESHOLDS
db, stop, pause = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
def raw(db):
    with connect_store(db) as con:
        return con.execute("SELECT count(*) FROM ingested_file").fetchone()[0]
readers = {"raw duckdb": raw, "summary": lambda db: summary_table(db).num_rows,
           "gate": lambda db: len(run_gate(db, DEFAULT_THRESHOLDS).verdicts),
           "dashboard query": lambda db: len(queries.store_overview(db))}
stats = {name: [0, 0] for name in readers}
seen = []
while not stop.exists():
    if not (db / "catalog.sqlite").exists():
        time.sleep(0.01)
        continue
    for name, read in readers.items():
        stats[name][0] += 1
        opened = time.time()
        try:
            value = read(db)
        except Exception:
            stats[name][1] += 1
            continue
        if name == "raw duckdb":
            seen.append((opened, value))
    time.sleep(pause)
print(json.dumps({"stats": stats, "seen": seen}))
"""


def write_small_logs(folder: Path, n_files: int, tokens_per_step: int = 512) -> int:
    """`n_files` small logs of one run, 4 steps each (as a hook writes with small steps, or many ranks
    do); returns the rows written."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = SyntheticSpec(run_id="many", tokens_per_step=tokens_per_step, mean_length=24)
    rows = 0
    for i in range(n_files):
        table = synthetic_steps(spec, 8 + 4 * i, 4)
        write_log_atomic(table, folder / f"many-{i:04d}.parquet")
        rows += table.num_rows
    return rows


def timed_replay(logs: Path, db: Path, with_readers: bool, pause: float = 0.0) -> dict:
    """Replay `logs` into a fresh `db` in a child process, with readers in another one (each round of the
    four readers `pause` seconds apart) or not."""
    shutil.rmtree(db, ignore_errors=True)
    stop = db.with_name(db.name + ".stop")
    stop.unlink(missing_ok=True)
    poller = None
    if with_readers:
        command = [sys.executable, "-c", POLL, str(db), str(stop), str(pause)]
        poller = subprocess.Popen(command, stdout=subprocess.PIPE)
    command = [sys.executable, "-m", "evaluator.cli", "replay", str(logs), "--db", str(db), "--no-progress"]
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    reported = [time.time() for line in child.stdout if ": ingested (" in line]
    child.wait()
    seconds = time.perf_counter() - started
    out = {"seconds": seconds, "files": len(reported)}
    if poller is not None:
        stop.touch()
        polled = json.loads(poller.communicate()[0].strip().splitlines()[-1])  # libraries may print first
        # Files replay had reported (it reports a file once committed) before the read began, that the
        # read did not see: 0 when every reader sees the latest commit.
        lags = [sum(t <= at for t in reported) - value for at, value in polled["seen"]]
        out |= {"stats": polled["stats"], "max_behind": max(lags, default=0)}
    return out


def run(n_files: int, out: Path, rounds: int, pause: float = 0.0) -> str:
    logs = out / "logs"
    rows = write_small_logs(logs, n_files)
    lines = [f"folder: {n_files} files, {rows:,} rows; readers {pause:g} s apart"]
    alone, with_readers = [], []
    for _ in range(rounds):  # alternating: the same machine state for both
        alone.append(timed_replay(logs, out / "alone", False))
        with_readers.append(timed_replay(logs, out / "read", True, pause))
    for a, r in zip(alone, with_readers, strict=True):
        lines.append(
            f"replay alone {a['seconds']:.2f} s, with readers {r['seconds']:.2f} s "
            f"({r['seconds'] / a['seconds'] - 1:+.1%}); a raw read missed at most {r['max_behind']} "
            "file(s) committed before it began"
        )
        for name, (attempts, failed) in r["stats"].items():
            lines.append(
                f"  {name}: {attempts - failed} of {attempts} reads succeeded ({1 - failed / attempts:.2%})"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200, help="number of small log files")
    parser.add_argument("--rounds", type=int, default=2, help="replays each way, alternating")
    parser.add_argument("--out", type=Path, default=None, help="folder to keep the logs and stores in")
    parser.add_argument(
        "--pause",
        type=float,
        default=0.0,
        help="seconds between rounds of the readers (0: as fast as they can)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="proxaudit-bench-readers-") as scratch:
        print(run(args.files, args.out or Path(scratch), args.rounds, args.pause))


if __name__ == "__main__":
    main()
