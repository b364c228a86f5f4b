"""`proxaudit bench`: replay throughput against a bare DuckDB scan of the same log, in one run.

The replay runs in a child process, started from a small launcher as a shell would start it. Its peak
memory is what the kernel recorded for it when it ended (`wait4`'s `ru_maxrss`, what `/usr/bin/time -v`
reports as "Maximum resident set size" and what a user's machine sees): the high-water mark of the
largest of the replay process and the worker processes it waited for. Beside it, the largest sum of the
resident sets of the process tree, sampled every 50 ms: a sum over workers, but blind to peaks between
samples. Validation is part of replay and is included in its time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from evaluator.duck import connect, literal
from evaluator.errors import ProxauditError
from evaluator.store import connect_store
from evaluator.trainer.synthetic import SyntheticSpec, write_synthetic_log


@dataclass
class BenchResult:
    tokens: int
    tokens_per_step: int
    scan_s: float
    replay_s: float
    replay_maxrss: int  # bytes: the kernel's peak resident set of the replay process (ChildRun.maxrss)
    replay_tree_peak: int  # bytes: the largest sampled sum over the process tree (ChildRun.tree_peak)
    log_bytes: int
    db_bytes: int
    identity_bytes: int  # the token identity data (`file_sequences`) inside the database
    n_sequences: int

    def render(self) -> str:
        scan, replay = self.tokens / self.scan_s / 1e6, self.tokens / self.replay_s / 1e6
        log_mib, db_mib = self.log_bytes / 2**20, self.db_bytes / 2**20
        maxrss, sampled = self.replay_maxrss / 2**20, self.replay_tree_peak / 2**20
        return "\n".join(
            [
                f"log: {self.tokens:,} tokens, {self.tokens_per_step:,} per step, {log_mib:,.1f} MiB",
                f"bare DuckDB scan of 3 log-prob columns: {self.scan_s:.2f} s, {scan:,.2f} M tokens/s",
                f"replay (validate + metrics + ingest):   {self.replay_s:.2f} s, {replay:,.2f} M tokens/s",
                f"replay / scan throughput: {replay / scan:.4f} (target >= 0.06)",
                f"replay peak RSS (the kernel's maxrss): {maxrss:,.0f} MiB (target < 2048 MiB); "
                f"the largest sample every 50 ms: {sampled:,.0f} MiB",
                f"database: {db_mib:,.2f} MiB = {db_mib / log_mib:.1%} of the log (target < 10%)",
                f"token identity (file_sequences): {self.n_sequences:,} sequences, "
                f"{self.identity_bytes / 2**10:,.0f} KiB = {self.identity_bytes / self.db_bytes:.1%} of the "
                "database (target: a few %)",
            ]
        )


def bare_scan_seconds(path: Path) -> float:
    """Best of two timed scans summing `behave_logp`, `prox_logp`, `theta_logp` (one warms the cache)."""
    con = connect()
    sums = "sum(behave_logp), sum(prox_logp), sum(theta_logp)"
    query = f"SELECT {sums} FROM read_parquet({literal(str(path))})"
    times = []
    for _ in range(2):
        start = time.perf_counter()
        con.execute(query).fetchall()
        times.append(time.perf_counter() - start)
    con.close()
    return min(times)


def table_bytes(db: Path, table: str) -> tuple[int, int]:
    """(rows, bytes) of one table of a store: the sizes of its Parquet data files."""
    with connect_store(db) as con:
        (size,) = con.execute(
            "SELECT coalesce(sum(data_file_size_bytes), 0)::BIGINT FROM ducklake_list_files('store', "
            f"{literal(table)})"
        ).fetchone()
        (rows,) = con.execute(f"SELECT count(*) FROM {table}").fetchone()
    return rows, size


def store_bytes(db: Path) -> int:
    """The bytes of a folder store: its catalog and every data file."""
    return sum(p.stat().st_size for p in db.rglob("*") if p.is_file())


def _tree_rss(processes: list[psutil.Process]) -> int:
    """Resident bytes of `processes` now (those that have exited count 0)."""
    total = 0
    for member in processes:
        try:
            total += member.memory_info().rss
        except psutil.Error:  # exited between listing and reading
            continue
    return total


@dataclass(frozen=True)
class ChildRun:
    """How a child process ran, measured from its parent."""

    seconds: float
    maxrss: int
    """bytes: the kernel's high-water mark of the child's resident set, or of the largest process it
    waited for (`wait4`'s ru_maxrss: what `/usr/bin/time -v` reports; never a sum over processes)"""
    tree_peak: int
    """bytes: the largest sum of the resident sets of the child and its descendants, sampled every 50 ms
    (a sum over processes, blind between samples)"""
    cpu_s: float
    """user + system seconds of the child and the processes it waited for"""


# Starts the command and reports the kernel's figures of it (wait4) on stdout; the command's own stdout
# goes to stderr. A process started by a large one is charged that one's peak resident set (the kernel
# records the parent's address space at exec, also for posix_spawn), so the command is started from
# this small launcher, as a shell would start it, never from the benchmark's own process.
LAUNCHER = """import os, sys
pid = os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ, file_actions=[(os.POSIX_SPAWN_DUP2, 2, 1)])
_, status, usage = os.wait4(pid, 0)
print(usage.ru_maxrss, usage.ru_utime + usage.ru_stime, flush=True)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_child(command: list[str]) -> ChildRun:
    """Run `command` (an executable's path first) to its end, measured; a `ProxauditError` with the end of
    its stderr if it fails."""
    with tempfile.TemporaryFile() as errors:  # a file, not a pipe: a full pipe would stall the child
        start = time.perf_counter()
        launcher = subprocess.Popen(
            [sys.executable, "-S", "-c", LAUNCHER, *command], stdout=subprocess.PIPE, stderr=errors, text=True
        )
        watched, peak = psutil.Process(launcher.pid), 0
        while launcher.poll() is None:
            with contextlib.suppress(psutil.Error):  # the command has just exited
                peak = max(peak, _tree_rss(watched.children(recursive=True)))
            time.sleep(0.05)
        seconds = time.perf_counter() - start
        if launcher.returncode != 0:
            errors.seek(0)
            raise ProxauditError(f"the benchmark's child failed: {errors.read().decode()[-2000:]}")
        maxrss_kib, cpu_s = launcher.stdout.read().split()
    return ChildRun(seconds, int(maxrss_kib) * 1024, peak, float(cpu_s))  # ru_maxrss is in KiB on Linux


def timed_replay(path: Path, db: Path, workers: int | None = None, ray_cpus: int | None = None) -> ChildRun:
    """`evaluator.replay.pipeline.replay(path, db)` in a child process, measured (`workers` as in replay;
    `ray_cpus`: on a local Ray of that many CPUs instead, its start included; Ray's worker processes
    are not the child's, so neither figure of memory counts them)."""
    ray = "local" if ray_cpus else None
    start_ray = (
        f"import ray; ray.init(num_cpus={ray_cpus}, include_dashboard=False, log_to_driver=False, "
        "configure_logging=False); "
        if ray_cpus
        else ""
    )
    code = (
        f"{start_ray}from evaluator.replay.pipeline import replay; import sys; "
        f"replay([sys.argv[1]], sys.argv[2], progress=False, workers={workers!r}, ray={ray!r})"
    )
    return run_child([sys.executable, "-c", code, str(path), str(db)])


def run_bench(
    n_tokens: int, *, tokens_per_step: int = 1 << 20, out: str | os.PathLike | None = None
) -> BenchResult:
    """Write a synthetic log of `n_tokens` (in `out`, or a temporary folder), then time both readers."""
    with tempfile.TemporaryDirectory(prefix="proxaudit-bench-") as scratch:
        folder = Path(out) if out is not None else Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        log, db = folder / "bench.parquet", folder / "bench-store"
        shutil.rmtree(db, ignore_errors=True)
        spec = SyntheticSpec(run_id="bench", tokens_per_step=tokens_per_step, mean_length=300)
        tokens = write_synthetic_log(log, n_tokens, spec)
        scan_s = bare_scan_seconds(log)
        run = timed_replay(log, db)
        n_sequences, identity = table_bytes(db, "file_sequences")
        return BenchResult(
            tokens,
            tokens_per_step,
            scan_s,
            run.seconds,
            run.maxrss,
            run.tree_peak,
            log.stat().st_size,
            store_bytes(db),
            identity,
            n_sequences,
        )
