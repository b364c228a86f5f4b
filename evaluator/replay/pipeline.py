"""`proxaudit replay`: validate token logs, replay them through every estimator, store the summaries.

In phases over the files of one call, in sorted order:

1. digest (BLAKE2b of the bytes, `evaluator.replay.slots`): a file already in the store (from where it
   is, or a copy of a stored file), or a byte copy of an earlier file of the call, is not read again;
2. check each file on its own (the rules of `proxaudit validate`);
3. judge the call (`evaluator.validate.judge_call`): the alignment audit pooled over a run's files
   and the data-driven findings (`evaluator.validate.findings`); an error skips the run's files, the
   warnings are stored (`run_findings`);
4. summarise each clean file streaming over record batches, stage it (its Parquet files written) and
   commit it with the files before and after it, up to 8 in one commit (`evaluator.replay.groups`,
   `evaluator.store.StoreWriter.commit`, which refuses a token already stored, or reports a stored file
   re-saved with other bytes as its copy), in order, with its evidence for the findings; at the end the store
   judges every run whose files changed on all its stored files (`evaluator.store.derived`), whichever
   replays ingested them.

Steps 2 and 4 run on worker processes, one file per worker (`evaluator.replay.workers`), while this process
ingests; a file long enough to be cut into ranges (`evaluator.replay.summarise.default_workers`) is summarised
by range threads instead. The stored numbers do not depend on which process summarised a file. Each
group of files is a commit of the store (`evaluator.store.StoreWriter`): readers never wait, and other
replays may write the same store at once (each file is ingested once, whichever takes it).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from evaluator.duck import one_thread
from evaluator.errors import FileFailed, NothingReadableError, UsageError
from evaluator.formulas.loss import DEFAULT_LOSS, Loss
from evaluator.problems import Problem
from evaluator.replay.groups import Groups, failed
from evaluator.replay.histograms import needs_compiled
from evaluator.replay.opening import alone, open_while
from evaluator.replay.outcomes import Announcer, FileOutcome, ReplayReport
from evaluator.replay.reading import footer_rows
from evaluator.replay.slots import Slot, digests, require_one_parquet, stored
from evaluator.replay.summarise import BATCH_ROWS, FileSummary, default_workers, summarise_file, usable_cores
from evaluator.replay.tasks import Check, StageTo, Summarise
from evaluator.replay.workers import LocalRunner, WorkerPool, load_kernels
from evaluator.sources import Staging
from evaluator.store import StoreWriter
from evaluator.store.group import StagedFile
from evaluator.validate import CheckedFile, check_file, find_parquet_files, judge_call
from evaluator.validate.found import Folder, found_folders, nothing_found


def _progress(files: list[Path], rows: int, enabled: bool | None) -> tqdm:
    """Files, tokens (`rows` in all) and tokens/s on stderr, only when stderr is a terminal (quiet in CI)."""
    disable = not sys.stderr.isatty() if enabled is None else not enabled
    return tqdm(total=rows, unit="tok", unit_scale=True, desc=f"0/{len(files)} files", disable=disable)


@dataclass
class Summarised:
    """A file checked (`CheckedFile`) and, if it broke no rule, summarised."""

    checked: CheckedFile
    summary: FileSummary | None = None


def check_and_summarise(
    path: Path,
    loss: Loss = DEFAULT_LOSS,
    *,
    batch_rows: int = BATCH_ROWS,
    workers: int | None = None,
    on_batch=None,
    sample: float = 1.0,
) -> Summarised:
    """Validate `path` on its own and, if it breaks no rule, summarise it (`summarise_file`), in this
    process: one file's replay without a store (tests and benchmarks compare summaries with it)."""
    checked = check_file(path)
    if checked.facts is None:
        return Summarised(checked)
    facts = checked.facts
    summary = summarise_file(
        path, facts.resumes, loss, n_sequences=facts.sequences.num_rows, on_batch=on_batch,
        batch_rows=batch_rows, workers=workers, sample=sample,
    )  # fmt: skip
    return Summarised(checked, summary)


def _check(slots: list[Slot], runner, bar: tqdm) -> None:
    """Check every file still to do (the rules of `proxaudit validate` on its own), on the runner."""
    todo = [s for s in slots if s.to_check]
    results = runner.map(Check(s.path) for s in todo)
    for i, (slot, checked) in enumerate(zip(todo, results, strict=True), 1):
        if isinstance(checked, FileFailed):
            slot.outcome = failed(slot.path, checked)
        else:
            slot.checked = checked
            bar.update(checked.report.n_rows or 0)
        bar.set_description(f"checked {i}/{len(todo)} files")


def _summaries(
    slots: list[Slot], runner, loss: Loss, bar: tqdm, sample: float, batch_rows: int, stage_to=None
) -> Iterator[tuple[Slot, FileSummary | StagedFile | Problem | FileFailed | None]]:
    """Each slot in order with its summary (None: a slot that is not summarised): runs of small files on
    the runner, a file long enough for ranges (`default_workers`) once the files before it are done: in
    threads of this process, or on a cluster's CPUs as range tasks (a runner with `cpus`), merged here.
    `stage_to(slot)`: the store the runner's workers stage the small files for themselves (a `StagedFile`,
    or the `Problem` of a file the store cannot keep)."""
    cpus = getattr(runner, "cpus", None)

    def kind(slot: Slot) -> str:
        if slot.outcome is not None or not slot.to_summarise:
            return "none"
        n_rows = slot.checked.report.n_rows
        return "long" if default_workers(n_rows, batch_rows=batch_rows, cores=cpus) > 1 else "small"

    for how, group in itertools.groupby(slots, key=kind):
        group = list(group)
        if how == "none":
            yield from ((slot, None) for slot in group)
        elif how == "small":
            stages = [stage_to(s) if stage_to else None for s in group]
            tasks = (
                Summarise(s.path, s.checked.facts.resumes, loss, _sequences(s), sample, c, batch_rows)
                for s, c in zip(group, stages, strict=True)
            )
            for slot, summary in zip(group, runner.map(tasks), strict=True):
                bar.update(slot.checked.report.n_rows)
                yield slot, summary
        else:
            for slot in group:
                yield slot, _summarise_long(slot, runner, loss, bar, sample, batch_rows)


def _sequences(slot: Slot) -> int:
    """The number of sequences the check found in the slot's file."""
    return slot.checked.facts.sequences.num_rows


def _summarise_long(
    slot: Slot, runner, loss: Loss, bar: tqdm, sample: float, batch_rows: int
) -> FileSummary | FileFailed:
    """A long file in ranges: threads here, or range tasks on a cluster's CPUs (a runner with `cpus`)."""
    cpus = getattr(runner, "cpus", None)
    workers = default_workers(slot.checked.report.n_rows, batch_rows=batch_rows, cores=cpus)
    range_map = runner.map if cpus else None
    try:
        return summarise_file(
            slot.path, slot.checked.facts.resumes, loss, n_sequences=_sequences(slot), on_batch=bar.update,
            batch_rows=batch_rows, workers=workers, range_map=range_map, sample=sample,
        )  # fmt: skip
    except Exception as error:  # one file's trouble never stops the others
        return FileFailed(f"summarising {slot.path} failed: {type(error).__name__}: {error}")


SMALL_INPUT_ROWS = 1 << 16
"""Up to this many rows in all (by the Parquet footers), a replay's DuckDB connections run on one thread
(`evaluator.duck.one_thread`): a small file's replay was 10% faster and 15% cheaper in CPU so on two cores,
where a 1M-token file's was 8% slower (BENCHMARKS.md)."""
MIN_ROWS_FOR_WORKERS = 1 << 20
"""A worker process costs about 2 CPU-seconds to start (its imports and numba's cache) and replaying costs
about 3 per million rows (BENCHMARKS.md): under this many rows in all, the files are replayed here."""


def file_workers(n_files: int, rows: int) -> int:
    """Worker processes over `n_files` files of `rows` rows in all (by their Parquet footers, `footer_rows`:
    an unreadable file counts none): one per usable core when there are several files holding at least
    `MIN_ROWS_FOR_WORKERS` rows, else none."""
    return usable_cores() if n_files >= 2 and rows >= MIN_ROWS_FOR_WORKERS else 1


def replay(
    paths: Sequence[str | os.PathLike],
    db_path: str | os.PathLike,
    *,
    on_file: Callable[[FileOutcome], None] | None = None,
    on_found: Callable[[list[Folder]], None] | None = None,
    progress: bool | None = None,
    workers: int | None = None,
    loss: Loss = DEFAULT_LOSS,
    max_staleness: int | None = None,
    staleness_limit: tuple[int, str, str] | None = None,
    ray: str | None = None,
    sample: float = 1.0,
    data_path: str | None = None,
    batch_rows: int = BATCH_ROWS,
    merge: bool = True,
) -> ReplayReport:
    """Replay every Parquet file under `paths` into the store at `db_path` (created if missing), in sorted
    order (see the module docstring; `on_found` hears first the folders they are in, with their runs), on
    `workers` processes (default `file_workers`; 1: all in this process), with the loss's thresholds
    `loss` for the decision metrics (recorded in the store; a store made with other parameters is
    refused) and the trainer's `max_staleness` for the findings; `staleness_limit` (the trainer's maximum
    staleness, where it was read, its config key) is recorded for the gate. `ray`:
    check and summarise on Ray instead (`"local"` starts one, else a cluster address;
    `evaluator.replay.ray_runner`), ingesting here in the same order. `sample`: the fraction of sequences
    summarised (`evaluator.replay.sampling`; recorded in the store). `data_path`: where a new store's
    Parquet files go (a folder or an s3:// prefix). `batch_rows`: the rows of a record batch
    (`evaluator.replay.summarise`; how long a file must be to be cut into ranges follows it). `merge`:
    False leaves merging the runs' staleness sketches to the caller
    (`evaluator.store.maintenance.merge_run_sketches`: `watch` raises its alerts first).

    Raises `UsageError` for a missing path, `NothingReadableError` when no file could be read and
    `StoreError` for a store of other parameters."""
    with Staging() as staging:
        files = find_parquet_files(paths, staging)
        if not files:
            raise NothingReadableError(nothing_found(paths))
        if staging.uris and ray not in (None, "local"):
            raise UsageError(
                "object-storage URIs are copied to this machine, where a cluster's workers cannot read them: "
                "replay them without --ray ADDRESS (or with a local --ray)"
            )
        require_one_parquet(files, staging)  # before the store: no input, no store
        if on_found is not None:
            on_found(found_folders(files, staging))
        announcer = Announcer(staging, on_file)
        ingest_s = 0.0
        rows = sum(footer_rows(path) for path in files)
        runner = _runner(ray, file_workers(len(files), rows) if workers is None else workers)
        writer = StoreWriter(
            db_path, loss, max_staleness=max_staleness, sample=sample, data_path=data_path, merge=merge
        )
        slots = digests(files, staging)
        with (
            one_thread(rows <= SMALL_INPUT_ROWS),
            contextlib.ExitStack() as opened,
            _progress(files, rows, progress) as bar,
            runner,
        ):

            def work(store: StoreWriter | None) -> tuple[list, Iterator]:
                stage_to = _worker_staging(store, staging, max_staleness) if ray is not None else None
                return _work(slots, runner, bar, loss, sample, batch_rows, max_staleness, stage_to)

            store, ahead = open_while(writer, opened, alone(slots, runner), lambda: work(None))
            if staleness_limit is not None:
                store.record_max_staleness(*staleness_limit)
            held = stored(slots, store.digests(), staging)
            findings, summaries = ahead if ahead and not held else work(store)
            with Groups(store, announcer) as groups:
                for i, (slot, summary) in enumerate(summaries, 1):
                    start = time.perf_counter()
                    groups.add(slot, summary, staging.location(slot.path))
                    ingest_s += time.perf_counter() - start if summary is not None else 0.0
                    bar.set_description(f"replayed {i}/{len(files)} files")
                start = time.perf_counter()
            ingest_s += time.perf_counter() - start  # the last group's commit
    outcomes = announcer.outcomes
    if all(o.status == "unreadable" for o in outcomes):
        raise NothingReadableError("no input file could be read: " + "; ".join(o.line() for o in outcomes))
    return ReplayReport(outcomes, findings, ingest_s)


def _work(
    slots: list[Slot],
    runner,
    bar: tqdm,
    loss: Loss,
    sample: float,
    batch_rows: int,
    max_staleness: int | None,
    stage_to=None,
) -> tuple[list, Iterator]:
    """The files' work before the store takes them: each file to do checked, the call judged (its
    findings), and the summaries (`_summaries`, lazily)."""
    if any(s.to_check and needs_compiled(footer_rows(s.path)) for s in slots):
        load_kernels()  # numba's start, while the files are checked (a small file needs none)
    _check(slots, runner, bar)
    checked = [s.checked for s in slots if s.checked is not None]
    findings = judge_call(checked, max_staleness, duplicates=False).findings
    bar.reset()
    return findings, _summaries(slots, runner, loss, bar, sample, batch_rows, stage_to)


def _worker_staging(store: StoreWriter, staging: Staging, max_staleness: int | None):
    """How a Ray worker stages a slot's file for this replay's store itself (its Parquet files written
    there, in parallel; this process then registers them in group commits). The store must be reachable
    from the workers: a shared folder, or a catalog URL with its data path."""
    db = store.location.given if store.location.folder is None else str(store.location.folder)

    def stage_to(slot: Slot) -> StageTo:
        facts, location = slot.checked, staging.location(slot.path)
        return StageTo(db, slot.digest, location, facts.facts.sequences, facts.evidence, max_staleness)

    return stage_to


def _runner(ray: str | None, workers: int):
    """Where files are checked and summarised: Ray (`"local"` starts one, else a cluster address), worker
    processes, or this process."""
    if ray is not None:
        from evaluator.replay.ray_runner import RayRunner

        return RayRunner(ray)
    return WorkerPool(workers) if workers > 1 else LocalRunner()
