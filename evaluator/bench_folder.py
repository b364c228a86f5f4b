"""`python -m evaluator.bench_folder`: a folder of hook-sized token logs replayed in one process (file
after file) and then on worker processes (one per core, `evaluator.workers`), in one run.

Each replay runs in a child process into a fresh store (`evaluator.bench.timed_replay`: seconds and the
peak RSS of the whole process tree, plus its CPU time: on a machine shared with other jobs the wall
time depends on them, the CPU time much less); the two stores are then compared table by table.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
from pathlib import Path

import duckdb

from evaluator.bench import timed_replay
from evaluator.synthetic import SyntheticSpec, write_synthetic_log

TABLES = ("file_tokens", "metric_moments", "sketch_by_step", "sketch_by_staleness")


def store_hash(db: Path) -> tuple[int, ...]:
    """One order-independent hash of each table's rows (bit-exact: doubles hash by their bits)."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        return tuple(con.execute(f"SELECT sum(hash(t)) FROM {t} AS t").fetchall()[0][0] for t in TABLES)
    finally:
        con.close()


def write_folder(folder: Path, n_files: int, n_tokens: int, tokens_per_step: int) -> int:
    """`n_files` logs of about `n_tokens` rows each (one run per file, like one trainer's hook files cut
    at the same steps); the total number of rows."""
    total = 0
    for i in range(n_files):
        spec = SyntheticSpec(
            run_id=f"bench-{i:03d}", seed=i, tokens_per_step=tokens_per_step, mean_length=256
        )
        total += write_synthetic_log(folder / f"bench-{i:03d}.parquet", n_tokens, spec)
    return total


def timed(logs: Path, db: Path, workers: int | None, total: int) -> str:
    """One replay of `logs` into a fresh `db`: seconds, tokens/s, CPU seconds (user + system, the whole
    process tree) and peak RSS."""
    db.unlink(missing_ok=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds, peak = timed_replay(logs, db, workers)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # includes the workers, waited for by the replay
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    name = "sequential (one process)  " if workers == 1 else "parallel (default workers)"
    rate, mib = total / seconds / 1e6, peak / 2**20
    return f"{name}: {seconds:6.2f} s, {rate:.2f} M tokens/s, CPU {cpu:.1f} s, peak RSS {mib:,.0f} MiB"


def run(n_files: int, n_tokens: int, tokens_per_step: int, out: Path, rounds: int) -> str:
    """Write the folder, then replay it `rounds` times each way, alternating (same machine state)."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    total = write_folder(logs, n_files, n_tokens, tokens_per_step)
    lines = [f"folder: {n_files} files, {total:,} tokens, {tokens_per_step:,} per step"]
    for _ in range(rounds):
        lines += [timed(logs, out / "seq.duckdb", 1, total), timed(logs, out / "par.duckdb", None, total)]
    same = store_hash(out / "seq.duckdb") == store_hash(out / "par.duckdb")
    lines.append(f"stores identical (hash of every table): {same}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=20, help="number of log files")
    parser.add_argument("--tokens", type=int, default=1 << 20, help="tokens per file")
    parser.add_argument("--tokens-per-step", type=int, default=1 << 20, help="tokens per training step")
    parser.add_argument("--rounds", type=int, default=2, help="replays each way, alternating")
    parser.add_argument("--out", type=Path, default=None, help="folder to keep the logs and stores in")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="proxaudit-bench-folder-") as scratch:
        print(run(args.files, args.tokens, args.tokens_per_step, args.out or Path(scratch), args.rounds))


if __name__ == "__main__":
    main()
