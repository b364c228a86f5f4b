"""`python -m evaluator.bench.store`: what the store's commits cost, in one run.

Both commit files as replay does: each file staged (its Parquet files written), then the staged files of
up to `GROUP_FILES` files registered in one transaction (a group commit, `StoreWriter.commit`).

- **Commit cost against the store's size** (`--files N`): one small log is checked and summarised once,
  then published N times as N distinct files (its steps and seq_ids shifted, a digest of its own each),
  each file's cost timed (its staging, and its share of its group's commit): the cost of the 10th file
  against the N-th (medians of ten around each), then the same after `proxaudit store compact`.
- **The commit path's serial share** (`--serial-files K --serial-tokens T`): K logs of T tokens each, of
  one run (consecutive steps, as a run's files are: its sketches are merged over files), each checked,
  summarised and staged (the work any number of workers share) and committed in groups (the transaction:
  checks, registering the files, the commit; one at a time per store), every phase timed; the writer's
  merges of the staleness sketches and the derived rows of the runs at the end are serial too. The serial
  share s gives Amdahl's projection of the speed-up on W workers, 1 / (s + (1 - s) / W).
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
from evaluator.replay.groups import GROUP_FILES
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
        for first, last in [*_groups(0, n_files), *_groups(n_files, n_files + 2 * GROUP_FILES)]:
            staged, stage_s = [], []
            for k in range(first, last):
                digest, summary, sequences = shifted_file(done, k, steps, seqs)
                start = time.perf_counter()
                staged.append(writer.stage(log, digest, summary, sequences, done.checked.evidence))
                stage_s.append(time.perf_counter() - start)
            before = writer.commit_s
            assert writer.commit(staged) == [True] * len(staged)
            share = (writer.commit_s - before) / len(staged)  # each file's share of its group's commit
            seconds += [t + share for t in stage_s]
            transactions += [share] * len(staged)
            if last == n_files:
                compaction = compact(db, expire_older_than_h=0)
    lines = [
        f"one file: {done.summary.n_rows:,} rows; {sum(t.num_rows for t in _tables(done)):,} summary rows"
    ]
    for name, times in (
        ("ingest (staging the files + the share of the group commit)", seconds),
        ("group commit, per file", transactions),
    ):
        early, late, after = (statistics.median(times[i : i + 10]) for i in (5, n_files - 5, n_files))
        lines.append(
            f"{name}: the 10th file {early * 1e3:.0f} ms, the {n_files:,}th {late * 1e3:.0f} ms (ratio "
            f"{late / early:.2f}); after compaction {after * 1e3:.0f} ms (ratio {after / early:.2f})"
        )
    return [*lines, f"compaction, snapshots expired: {compaction.line()}"]


def _groups(start: int, stop: int) -> list[tuple[int, int]]:
    """The (first, last + 1) of each group of files replay commits together, from `start` to `stop`."""
    return [(i, min(i + GROUP_FILES, stop)) for i in range(start, stop, GROUP_FILES)]


def _tables(done: Summarised) -> list[pa.Table]:
    s = done.summary
    return [s.file_tokens, s.moments, s.sketch_by_step, s.sketch_by_staleness, done.checked.facts.sequences]


def serial_share(folder: Path, n_files: int, n_tokens: int) -> list[str]:
    logs, spec = [], SyntheticSpec(run_id="serial", seed=1, tokens_per_step=1 << 18, mean_length=256)
    steps_per_file = -(-n_tokens // spec.tokens_per_step)
    for i in range(n_files):  # one run's consecutive steps, as its ranks' and steps' files are
        path = folder / f"serial-{i:03d}.parquet"
        write_synthetic_log(path, n_tokens, spec, first_step=i * steps_per_file)
        logs.append(path)
    db = folder / "serial"
    shutil.rmtree(db, ignore_errors=True)
    work = commit = merges = 0.0
    with StoreWriter(db) as writer:
        for first, last in _groups(0, n_files):
            staged = []
            for path in logs[first:last]:
                start = time.perf_counter()
                done = check_and_summarise(path, workers=1)
                checked = done.checked
                staged.append(
                    writer.stage(
                        path, file_digest(path), done.summary, checked.facts.sequences, checked.evidence
                    )
                )
                work += time.perf_counter() - start
            before, start = writer.commit_s, time.perf_counter()
            writer.commit(staged)
            commit += writer.commit_s - before  # the transaction: checks, registering files, commit
            merges += time.perf_counter() - start - (writer.commit_s - before)  # the runs' sketches merged
        start = time.perf_counter()
        writer.refresh()
        derived = time.perf_counter() - start
    lines = [
        f"{n_files} files of {n_tokens:,} tokens: check + summarise + digest + stage {work:.2f} s "
        f"(parallel part), group commits of up to {GROUP_FILES} files {commit:.2f} s, the writer's merges of "
        f"the staleness sketches {merges:.2f} s, the runs' derived rows {derived:.2f} s (serial part)"
    ]
    serial_parts = (commit, commit + merges, commit + merges + derived)
    for name, serial in zip(("commits", "+ sketch merges", "+ derived rows"), serial_parts, strict=True):
        s = serial / (serial + work)
        lines.append(
            f"serial share ({name}) {s:.2%}: Amdahl's speed-up on {WORKERS} workers "
            f"{1 / (s + (1 - s) / WORKERS):.1f}x"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1000, help="commits of the cost test")
    parser.add_argument(
        "--serial-files", type=int, default=GROUP_FILES, help="files of the serial-share test"
    )
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
