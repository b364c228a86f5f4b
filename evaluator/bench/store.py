"""`python -m evaluator.bench.store`: what the store's commits cost, in one run.

- **Commit cost against the store's size** (`--files N`): one small log is checked and summarised once,
  then committed N times as N distinct files (its steps and seq_ids shifted, a digest of its own each),
  each commit timed: the cost of the 10th file against the N-th (medians of ten around each), then the
  same after `proxaudit store compact`.
- **The commit path's serial share** (`--serial-files K --serial-tokens T`): K logs of T tokens each,
  each checked, summarised and written as Parquet files (the work any number of workers share) and
  committed (the transaction: checks, registering the files, the commit; one at a time per store), every
  phase timed; the derived rows of the runs at the end are serial too. The
  serial share s gives Amdahl's projection of the speed-up on W workers, 1 / (s + (1 - s) / W).
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from evaluator.logio import write_log_atomic
from evaluator.replay.pipeline import Summarised, check_and_summarise
from evaluator.store import StoreWriter, file_digest
from evaluator.store.maintenance import compact
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps, write_synthetic_log

WORKERS = 32


def _shifted(table: pa.Table, column: str, by: int) -> pa.Table:
    if column not in table.column_names:
        return table
    i = table.column_names.index(column)
    return table.set_column(i, column, pc.add(table[column], pa.scalar(by, table.schema.field(column).type)))


def shifted_file(done: Summarised, k: int, steps: int, seqs: int) -> tuple[str, object, pa.Table]:
    """The k-th distinct file made of one summarised file: (digest, summary, sequences)."""
    s = done.summary
    summary = replace(
        s,
        file_tokens=_shifted(s.file_tokens, "step", k * steps),
        moments=_shifted(s.moments, "step", k * steps),
        sketch_by_step=_shifted(s.sketch_by_step, "step", k * steps),
    )
    digest = hashlib.blake2b(f"bench-file-{k}".encode(), digest_size=32).hexdigest()
    return digest, summary, _shifted(done.checked.facts.sequences, "seq_id", k * seqs)


def commit_costs(folder: Path, n_files: int) -> list[str]:
    spec = SyntheticSpec(run_id="commits", tokens_per_step=256, mean_length=16)
    log = write_log_atomic(synthetic_steps(spec, 0, 2), folder / "small.parquet")
    done = check_and_summarise(log)
    steps = int(pc.max(done.summary.file_tokens["step"]).as_py()) + 1
    seqs = int(pc.max(done.checked.facts.sequences["seq_id"]).as_py()) + 1
    db = folder / "commits"
    shutil.rmtree(db, ignore_errors=True)
    seconds, transactions = [], []
    with StoreWriter(db) as writer:
        for k in range(n_files + 10):
            digest, summary, sequences = shifted_file(done, k, steps, seqs)
            start, before = time.perf_counter(), writer.commit_s
            assert writer.ingest(log, digest, summary, sequences, done.checked.evidence) is True
            seconds.append(time.perf_counter() - start)
            transactions.append(writer.commit_s - before)
            if k == n_files - 1:
                compaction = compact(db, expire_older_than_h=0)
    lines = [
        f"one file: {done.summary.n_rows:,} rows; {sum(t.num_rows for t in _tables(done)):,} summary rows"
    ]
    for name, times in (
        ("ingest (writing the files + the transaction)", seconds),
        ("transaction", transactions),
    ):
        early, late, after = (statistics.median(times[i : i + 10]) for i in (5, n_files - 5, n_files))
        lines.append(
            f"{name}: the 10th file {early * 1e3:.0f} ms, the {n_files:,}th {late * 1e3:.0f} ms (ratio "
            f"{late / early:.2f}); after compaction {after * 1e3:.0f} ms (ratio {after / early:.2f})"
        )
    return [*lines, f"compaction, snapshots expired: {compaction.line()}"]


def _tables(done: Summarised) -> list[pa.Table]:
    s = done.summary
    return [s.file_tokens, s.moments, s.sketch_by_step, s.sketch_by_staleness, done.checked.facts.sequences]


def serial_share(folder: Path, n_files: int, n_tokens: int) -> list[str]:
    logs = []
    for i in range(n_files):
        spec = SyntheticSpec(run_id=f"serial-{i}", seed=i, tokens_per_step=1 << 18, mean_length=256)
        path = folder / f"serial-{i:03d}.parquet"
        write_synthetic_log(path, n_tokens, spec)
        logs.append(path)
    db = folder / "serial"
    shutil.rmtree(db, ignore_errors=True)
    work = commit = 0.0
    with StoreWriter(db) as writer:
        for path in logs:
            start = time.perf_counter()
            done = check_and_summarise(path, workers=1)
            digest = file_digest(path)
            work += time.perf_counter() - start
            start, before = time.perf_counter(), writer.commit_s
            writer.ingest(path, digest, done.summary, done.checked.facts.sequences, done.checked.evidence)
            commit += writer.commit_s - before  # the transaction: checks, registering files, commit
            work += time.perf_counter() - start - (writer.commit_s - before)  # writing the files
        start = time.perf_counter()
        writer.refresh()
        derived = time.perf_counter() - start
    lines = [
        f"{n_files} files of {n_tokens:,} tokens: check + summarise + digest + write files {work:.2f} s "
        f"(parallel part), commits {commit:.2f} s, the runs' derived rows {derived:.2f} s (serial part)"
    ]
    for name, serial in (("commits", commit), ("commits + derived rows", commit + derived)):
        s = serial / (serial + work)
        lines.append(
            f"serial share ({name}) {s:.2%}: Amdahl's speed-up on {WORKERS} workers "
            f"{1 / (s + (1 - s) / WORKERS):.1f}x"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1000, help="commits of the cost test")
    parser.add_argument("--serial-files", type=int, default=4, help="files of the serial-share test")
    parser.add_argument("--serial-tokens", type=int, default=1 << 20, help="tokens per file of that test")
    parser.add_argument("--out", type=Path, default=None, help="folder to keep the logs and stores in")
    parser.add_argument("--skip-commits", action="store_true", help="only the serial share")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="proxaudit-bench-store-") as scratch:
        out = args.out or Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        lines = [] if args.skip_commits else commit_costs(out, args.files)
        print("\n".join(lines + serial_share(out, args.serial_files, args.serial_tokens)))


if __name__ == "__main__":
    main()
