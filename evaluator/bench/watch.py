"""`python -m evaluator.bench.watch`: `proxaudit watch` following a simulated run (one token log of about 1M
tokens every 10 s, a drift planted from a chosen step, growing to the run's end or until a chosen step, from
which the files are alike), in processes of their own as a user runs them.

Figures: for each file, the time from its rename into the folder (the writer's clock) to watch's line
saying it is ingested; for each alert, the time from the file it was judged after (`as_of`) being written
to the alert's line in the alerts file; watch's resident memory, its own process's, that of the processes
it starts (its looks' process and replay's workers) and the two together, sampled every 2 s (written to
OUT/memory.tsv as taken): min, median and max over the first and the last third of the run (the min is
watch between files, the max replaying one), and the ratio of the medians.
Watch's stdout, each line with the time it arrived, is kept in OUT/watch-stdout.txt. `--breakdown` then
replays the same files one by one in this process, each followed by watch's judging, and prints the CPU
seconds of each part and the memory between files.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import psutil

SAMPLE_S = 2.0


def _lines(stream, into: list[tuple[float, str]]) -> threading.Thread:
    """Read a child's lines in a thread, each with the time it arrived."""

    def read() -> None:
        for line in stream:
            into.append((time.time(), line.rstrip("\n")))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _rss(process: psutil.Process) -> tuple[int, int]:
    """Resident bytes of a process and of its children, apart ((0, 0) once it is gone)."""
    try:
        own = process.memory_info().rss
        children = 0
        for child in process.children(recursive=True):
            with contextlib.suppress(psutil.Error):  # a worker that ended meanwhile
                children += child.memory_info().rss
        return own, children
    except psutil.Error:
        return 0, 0


def run(
    files: int,
    interval: float,
    tokens: int,
    drift_from: int,
    drift_rate: float,
    drift_until: int | None,
    out: Path,
) -> str:
    logs, db, alerts = out / "logs", out / "metrics", out / "alerts.jsonl"
    writer_args = [
        sys.executable, "-m", "evaluator.trainer.simulated_run", str(logs), "--files", str(files),
        "--interval", str(interval), "--tokens-per-step", str(tokens), "--drift-from-step", str(drift_from),
        "--drift-rate", str(drift_rate), "--run-id", "bench",
        *(["--drift-until-step", str(drift_until)] if drift_until is not None else []),
    ]  # fmt: skip
    watch_args = [
        sys.executable, "-m", "evaluator.cli", "watch", str(logs), "--db", str(db), "--alerts", str(alerts),
        "--interval", "1", "--idle-after", str(3 * interval), "--until-idle",
    ]  # fmt: skip
    written: list[tuple[float, str]] = []
    said: list[tuple[float, str]] = []
    watch = subprocess.Popen(watch_args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    writer = subprocess.Popen(writer_args, stdout=subprocess.PIPE, text=True)
    readers = [_lines(writer.stdout, written), _lines(watch.stdout, said)]
    process, memory, started = psutil.Process(watch.pid), [], time.time()
    with open(out / "memory.tsv", "w") as samples:  # as taken: a run cut short keeps them
        samples.write("seconds\twatch_rss_bytes\tworkers_rss_bytes\n")
        while watch.poll() is None:
            memory.append((time.time() - started, *_rss(process)))
            seconds, own, children = memory[-1]
            samples.write(f"{seconds:.1f}\t{own}\t{children}\n")
            samples.flush()
            time.sleep(SAMPLE_S)
    writer.wait()
    for thread in readers:
        thread.join()
    (out / "watch-stdout.txt").write_text("".join(f"{t:.3f} {line}\n" for t, line in said))
    return report(written, said, alerts, memory, watch.returncode, files, tokens, interval)


def report(written, said, alerts: Path, memory, code: int, files: int, tokens: int, interval: float) -> str:
    at = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for _, line in written}
    ingested = {line.split(": ingested")[0]: t for t, line in said if ": ingested (" in line}
    to_ingest = np.array([ingested[p] - at[p] for p in at if p in ingested])
    lines = [
        f"simulated run: {files} files of {tokens:,} tokens, one every {interval:g} s; exit code {code}",
        f"file written -> ingested line: {len(to_ingest)} files, median {np.median(to_ingest):.1f} s, "
        f"max {to_ingest.max():.1f} s",
    ]
    records = [json.loads(line) for line in alerts.read_text().splitlines()] if alerts.exists() else []
    for r in records:
        if r.get("as_of") in at:
            delay = datetime.fromisoformat(r["time"]).timestamp() - at[r["as_of"]]
            change = f"{r['kind']} {r['previous']} -> {r['state']}"
            lines.append(f"file written -> alert line: {delay:5.1f} s  ({change})")
        else:
            lines.append(f"alert without a file of this run before it: {r['kind']} {r['state']}")
    sampled = np.array([(own, children, own + children) for _, own, children in memory if own]) / 2**20
    apart = (
        (0, "watch's own RSS"),
        (1, "its look's and worker processes' RSS"),
        (2, "watch's RSS with theirs"),
    )
    for column, what in apart:
        first, _, last = np.array_split(sampled[len(sampled) // 10 :, column], 3)  # after the start (imports)
        for name, part in (("first", first), ("last", last)):
            lines.append(
                f"{what} (every {SAMPLE_S:g} s), {name} third of the run: min {part.min():.0f}, median "
                f"{np.median(part):.0f}, max {part.max():.0f} MiB"
            )
        if np.median(first) > 0:
            lines.append(
                f"{what}, median of the last third / the first: {np.median(last) / np.median(first):.3f}"
            )
    return "\n".join(lines)


def breakdown(logs: Path, db: Path) -> str:
    """Where each file's time goes: the files of `logs` replayed one after the other into a fresh `db`, in
    this process, each followed by what watch does next (`judge_runs`, `run_trends`): CPU seconds of each
    (this process and its children), and the resident memory between files."""
    import gc
    import resource

    from evaluator.replay import replay
    from evaluator.watch.judge import judge_runs
    from evaluator.watch.trends import run_trends

    def cpu() -> float:
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    lines, me = ["file  replay CPU s  judge_runs CPU s  run_trends CPU s  RSS after, MiB"], psutil.Process()
    for i, log in enumerate(sorted(logs.glob("*.parquet"))):
        start = cpu()
        replay([log], db, progress=False)
        replayed = cpu()
        judge_runs(db)
        judged = cpu()
        run_trends(db, "loglinear_shipped", 0.01)
        done = cpu()
        gc.collect()
        rss = me.memory_info().rss / 2**20
        lines.append(
            f"{i:4d}  {replayed - start:12.1f}  {judged - replayed:16.2f}  {done - judged:16.2f}  {rss:14.0f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=18, help="files the simulated run writes")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between two files")
    parser.add_argument("--tokens", type=int, default=1 << 20, help="tokens per file (one step each)")
    parser.add_argument("--drift-from-step", type=int, default=4, help="the step the planted drift starts at")
    parser.add_argument("--drift-rate", type=float, default=0.03, help="its growth per step")
    parser.add_argument(
        "--drift-until-step", type=int, default=None,
        help="the step it stops growing at (default: never; from there the files are alike)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="keep the logs, store and alerts here")
    parser.add_argument("--breakdown", action="store_true", help="then each file's CPU time, file by file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="proxaudit-bench-watch-") as scratch:
        out = args.out or Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        print(
            run(
                args.files,
                args.interval,
                args.tokens,
                args.drift_from_step,
                args.drift_rate,
                args.drift_until_step,
                out,
            ),
            flush=True,
        )
        if args.breakdown:
            print(breakdown(out / "logs", out / "breakdown"))


if __name__ == "__main__":
    main()
