"""`python -m evaluator.bench.folder`: a folder of hook-sized token logs replayed in one process (file
after file) and then on worker processes (one per core, `evaluator.replay.workers`), in one run.

Each replay runs in a child process into a fresh store (`evaluator.bench.replay.timed_replay`: seconds, the
kernel's peak RSS of its largest process, the largest sampled sum over its process tree, and its CPU
time: on a machine shared with other jobs the wall time depends on them, the CPU time much less); the
two stores are then compared table by table.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from evaluator.bench.replay import timed_replay
from evaluator.store import connect_store
from evaluator.trainer.synthetic import SyntheticSpec, write_synthetic_log

TABLES = ("file_tokens", "metric_moments", "sketch_by_step", "sketch_by_staleness")


def store_hash(db: Path) -> tuple[int, ...]:
    """One order-independent hash of each table's rows (bit-exact: doubles hash by their bits)."""
    with connect_store(db) as con:
        return tuple(con.execute(f"SELECT sum(hash(t)) FROM {t} AS t").fetchall()[0][0] for t in TABLES)


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


def timed(logs: Path, db: Path, workers: int | None, total: int, ray_cpus: int | None = None) -> str:
    """One replay of `logs` into a fresh `db`: seconds, tokens/s, CPU seconds (user + system, the whole
    process tree; not Ray's, whose processes are not ours to wait for) and peak RSS (the kernel's, of the
    largest process; and the sampled sum over the tree)."""
    shutil.rmtree(db, ignore_errors=True)
    run = timed_replay(logs, db, workers, ray_cpus)
    name = {1: "sequential (one process)  ", None: "parallel (default workers)"}.get(workers)
    name = f"local Ray, {ray_cpus} CPU{'s' * (ray_cpus != 1)}".ljust(26) if ray_cpus else name
    rate, maxrss, tree = total / run.seconds / 1e6, run.maxrss / 2**20, run.tree_peak / 2**20
    return (
        f"{name}: {run.seconds:6.2f} s, {rate:.2f} M tokens/s, CPU {run.cpu_s:.1f} s, "
        f"peak RSS {maxrss:,.0f} MiB (largest process), {tree:,.0f} MiB (tree, sampled)"
    )


def ingest_rate(logs: Path, db: Path, total: int) -> str:
    """The single writer's rate: tokens per second of ingest time alone (a replay in this process)."""
    from evaluator.replay.pipeline import replay

    shutil.rmtree(db, ignore_errors=True)
    report = replay([logs], db, progress=False, workers=1)
    return (
        f"ingest alone (the writer): {report.ingest_s:6.2f} s, {total / report.ingest_s / 1e6:.2f} M tokens/s"
    )


def run(n_files: int, n_tokens: int, tokens_per_step: int, out: Path, rounds: int, ray: bool = False) -> str:
    """Write the folder, then replay it `rounds` times each way, alternating (same machine state); with
    `ray`, also on a local Ray of 1 and 2 CPUs, and the writer's ingest rate."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    total = write_folder(logs, n_files, n_tokens, tokens_per_step)
    lines = [f"folder: {n_files} files, {total:,} tokens, {tokens_per_step:,} per step"]
    for _ in range(rounds):
        lines += [timed(logs, out / "seq", 1, total), timed(logs, out / "par", None, total)]
        if ray:
            lines += [timed(logs, out / f"ray{k}", 1, total, ray_cpus=k) for k in (1, 2)]
    stores = ["par", *(["ray1", "ray2"] if ray else [])]
    same = all(store_hash(out / "seq") == store_hash(out / s) for s in stores)
    lines.append(f"stores identical (hash of every table): {same}")
    if ray:
        lines.append(ingest_rate(logs, out / "ingest", total))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=20, help="number of log files")
    parser.add_argument("--tokens", type=int, default=1 << 20, help="tokens per file")
    parser.add_argument("--tokens-per-step", type=int, default=1 << 20, help="tokens per training step")
    parser.add_argument("--rounds", type=int, default=2, help="replays each way, alternating")
    parser.add_argument("--out", type=Path, default=None, help="folder to keep the logs and stores in")
    parser.add_argument("--ray", action="store_true", help="also on a local Ray of 1 and 2 CPUs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="proxaudit-bench-folder-") as scratch:
        out = args.out or Path(scratch)
        print(run(args.files, args.tokens, args.tokens_per_step, out, args.rounds, args.ray))


if __name__ == "__main__":
    main()
