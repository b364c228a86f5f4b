"""`proxaudit bench`: replay throughput against a bare DuckDB scan of the same log, in one run.

The replay runs in a child process; its peak memory is the largest sum of the resident sets of that
process and its own worker processes, sampled every 50 ms. Validation is part of replay and is
included in its time.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from evaluator.duck import connect
from evaluator.errors import ProxauditError
from evaluator.trainer.synthetic import SyntheticSpec, write_synthetic_log


@dataclass
class BenchResult:
    tokens: int
    tokens_per_step: int
    scan_s: float
    replay_s: float
    replay_peak_rss: int  # bytes, the replay process and its workers together
    log_bytes: int
    db_bytes: int
    identity_bytes: int  # the token identity data (`file_sequences`) inside the database
    n_sequences: int

    def render(self) -> str:
        scan, replay = self.tokens / self.scan_s / 1e6, self.tokens / self.replay_s / 1e6
        log_mib, db_mib = self.log_bytes / 2**20, self.db_bytes / 2**20
        return "\n".join(
            [
                f"log: {self.tokens:,} tokens, {self.tokens_per_step:,} per step, {log_mib:,.1f} MiB",
                f"bare DuckDB scan of 3 log-prob columns: {self.scan_s:.2f} s, {scan:,.2f} M tokens/s",
                f"replay (validate + metrics + ingest):   {self.replay_s:.2f} s, {replay:,.2f} M tokens/s",
                f"replay / scan throughput: {replay / scan:.4f} (target >= 0.06)",
                f"replay peak RSS, with workers: {self.replay_peak_rss / 2**20:,.0f} MiB (target < 2048 MiB)",
                f"database: {db_mib:,.2f} MiB = {db_mib / log_mib:.1%} of the log (target < 10%)",
                f"token identity (file_sequences): {self.n_sequences:,} sequences, "
                f"{self.identity_bytes / 2**10:,.0f} KiB = {self.identity_bytes / self.db_bytes:.1%} of the "
                "database (target: a few %)",
            ]
        )


def bare_scan_seconds(path: Path) -> float:
    """Best of two timed scans summing `behave_logp`, `prox_logp`, `theta_logp` (one warms the cache)."""
    con = connect()
    escaped = str(path).replace("'", "''")
    query = f"SELECT sum(behave_logp), sum(prox_logp), sum(theta_logp) FROM read_parquet('{escaped}')"
    times = []
    for _ in range(2):
        start = time.perf_counter()
        con.execute(query).fetchall()
        times.append(time.perf_counter() - start)
    con.close()
    return min(times)


def table_bytes(db: Path, table: str) -> tuple[int, int]:
    """(rows, bytes) of one table in a DuckDB file: its column segments' extents in their blocks, each
    up to the next segment of any table (or the block's end), from `pragma_storage_info`: an upper bound."""
    with connect(str(db), read_only=True) as con:
        tables = [t for (t,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()]
        parts = " UNION ALL ".join(
            f"SELECT '{t}' AS t, block_id, block_offset FROM pragma_storage_info('{t}') WHERE block_id >= 0"
            for t in tables
        )
        block = "(SELECT block_size FROM pragma_database_size())"
        size = con.execute(
            f"""SELECT coalesce(sum(end_offset - block_offset) FILTER (WHERE t = ?), 0)::BIGINT FROM (
                SELECT t, block_offset, coalesce(lead(block_offset) OVER (
                           PARTITION BY block_id ORDER BY block_offset), {block}) AS end_offset
                FROM ({parts}))""",
            [table],
        ).fetchone()[0]
        (rows,) = con.execute(f"SELECT count(*) FROM {table}").fetchone()
    return rows, size


def _tree_rss(process: psutil.Process) -> int:
    """Resident bytes of `process` and all its descendants now (0 once it has exited)."""
    total = 0
    for member in (process, *process.children(recursive=True)):
        try:
            total += member.memory_info().rss
        except psutil.Error:  # exited between listing and reading
            continue
    return total


def timed_replay(
    path: Path, db: Path, workers: int | None = None, ray_cpus: int | None = None
) -> tuple[float, int]:
    """Seconds and peak RSS of the process tree (bytes) of `proxaudit replay path --db db` in a child
    (`workers` as in `evaluator.replay.pipeline.replay`; `ray_cpus`: on a local Ray of that many CPUs instead,
    its start included)."""
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
    with tempfile.TemporaryFile() as errors:  # a file, not a pipe: a full pipe would stall the child
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-c", code, str(path), str(db)], stderr=errors)
        watched, peak = psutil.Process(child.pid), 0
        while child.poll() is None:
            with contextlib.suppress(psutil.Error):  # the child itself has just exited
                peak = max(peak, _tree_rss(watched))
            time.sleep(0.05)
        seconds = time.perf_counter() - start
        if child.returncode != 0:
            errors.seek(0)
            raise ProxauditError(f"replay failed in the benchmark: {errors.read().decode()[-2000:]}")
    return seconds, peak


def run_bench(
    n_tokens: int, *, tokens_per_step: int = 1 << 20, out: str | os.PathLike | None = None
) -> BenchResult:
    """Write a synthetic log of `n_tokens` (in `out`, or a temporary folder), then time both readers."""
    with tempfile.TemporaryDirectory(prefix="proxaudit-bench-") as scratch:
        folder = Path(out) if out is not None else Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        log, db = folder / "bench.parquet", folder / "bench.duckdb"
        db.unlink(missing_ok=True)
        spec = SyntheticSpec(run_id="bench", tokens_per_step=tokens_per_step, mean_length=300)
        tokens = write_synthetic_log(log, n_tokens, spec)
        scan_s = bare_scan_seconds(log)
        replay_s, peak = timed_replay(log, db)
        n_sequences, identity = table_bytes(db, "file_sequences")
        return BenchResult(
            tokens,
            tokens_per_step,
            scan_s,
            replay_s,
            peak,
            log.stat().st_size,
            db.stat().st_size,
            identity,
            n_sequences,
        )
