"""`proxaudit bench`: replay throughput against a bare DuckDB scan of the same log, in one run.

The replay runs in a child process so that its peak RSS (`ru_maxrss` of the children) is its own.
Validation is part of replay and is included in its time.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb

from evaluator.errors import ProxauditError
from evaluator.synthetic import SyntheticSpec, write_synthetic_log


@dataclass
class BenchResult:
    tokens: int
    tokens_per_step: int
    scan_s: float
    replay_s: float
    replay_peak_rss: int  # bytes
    log_bytes: int
    db_bytes: int

    def render(self) -> str:
        scan, replay = self.tokens / self.scan_s / 1e6, self.tokens / self.replay_s / 1e6
        log_mib, db_mib = self.log_bytes / 2**20, self.db_bytes / 2**20
        return "\n".join(
            [
                f"log: {self.tokens:,} tokens, {self.tokens_per_step:,} per step, {log_mib:,.1f} MiB",
                f"bare DuckDB scan of 3 log-prob columns: {self.scan_s:.2f} s, {scan:,.2f} M tokens/s",
                f"replay (validate + metrics + ingest):   {self.replay_s:.2f} s, {replay:,.2f} M tokens/s",
                f"replay / scan throughput: {replay / scan:.4f} (target >= 0.333)",
                f"replay peak RSS: {self.replay_peak_rss / 2**20:,.0f} MiB (target < 2048 MiB)",
                f"database: {db_mib:,.2f} MiB = {db_mib / log_mib:.1%} of the log (target < 10%)",
            ]
        )


def bare_scan_seconds(path: Path) -> float:
    """Best of two timed scans summing `behave_logp`, `prox_logp`, `theta_logp` (one warms the cache)."""
    con = duckdb.connect()
    escaped = str(path).replace("'", "''")
    query = f"SELECT sum(behave_logp), sum(prox_logp), sum(theta_logp) FROM read_parquet('{escaped}')"
    times = []
    for _ in range(2):
        start = time.perf_counter()
        con.execute(query).fetchall()
        times.append(time.perf_counter() - start)
    con.close()
    return min(times)


def timed_replay(path: Path, db: Path) -> tuple[float, int]:
    """Seconds and peak RSS (bytes) of `proxaudit replay path --db db` in a child process."""
    code = (
        "from evaluator.replay import replay; import sys; replay([sys.argv[1]], sys.argv[2], progress=False)"
    )
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, str(path), str(db)], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise ProxauditError(f"replay failed in the benchmark: {done.stderr.strip()[-2000:]}")
    return seconds, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux


def run_bench(
    n_tokens: int, *, tokens_per_step: int = 1 << 20, out: str | os.PathLike | None = None
) -> BenchResult:
    """Write a synthetic log of `n_tokens` (in `out`, or a temporary folder), then time both readers."""
    with tempfile.TemporaryDirectory(prefix="proxaudit-bench-") as scratch:
        folder = Path(out) if out is not None else Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        log, db = folder / "bench.parquet", folder / "bench.duckdb"
        db.unlink(missing_ok=True)
        spec = SyntheticSpec(run_id="bench", tokens_per_step=tokens_per_step, mean_length=256)
        tokens = write_synthetic_log(log, n_tokens, spec)
        scan_s = bare_scan_seconds(log)
        replay_s, peak = timed_replay(log, db)
        return BenchResult(
            tokens, tokens_per_step, scan_s, replay_s, peak, log.stat().st_size, db.stat().st_size
        )
