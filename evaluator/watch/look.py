"""One look's work (`Look`): the newly complete files imported (a trainer's dump) and replayed into the
store, then every run judged again on the latest snapshot; once watch has raised the look's alerts, its
tidying (`Tidy`): the new files' staleness sketches merged into their runs', and every `MERGE_EVERY`
tidyings the small data files merged. Both run in a process of their own (`LookProcess`),
replaced after `LOOKS_PER_PROCESS` looks. Watch itself lists folders and raises alerts: its resident memory
stays flat however long the run, and what a look's libraries keep between looks (DuckDB's and Arrow's
allocators, pooled reader connections) goes with the process that kept it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from evaluator.errors import FileFailed, NothingReadableError, ProxauditError, UsageError
from evaluator.formulas.loss import Loss
from evaluator.replay import replay
from evaluator.replay.workers import WorkerPool
from evaluator.store.checks import checked_up_to, trust_checked
from evaluator.store.lake import locate
from evaluator.store.maintenance import merge_run_sketches, merge_small_files
from evaluator.validate.report import findings_lines
from evaluator.watch.completeness import Entry
from evaluator.watch.dumps import DumpImporter
from evaluator.watch.judge import RunVerdict, default_thresholds, gated, judge_runs
from evaluator.watch.trends import RunTrend, run_trends
from schemas.thresholds import Thresholds

LOOK_WORKER = "evaluator.watch.look_worker"
LOOKS_PER_PROCESS = 20
"""Looks one process does before a fresh one takes over (its start, about a second, paid once per 20)."""


@dataclass
class LookResult:
    """What a look did: the lines to show (text, to stderr), the files ingested (in order), whether its
    files count as handed (False: one vanished before replay; they are handed again), the verdicts and
    trends (None: not judged), the importer with what it met, the snapshot up to which the store's values
    were checked (handed to the next look: a fresh process does not read the whole store again), or the
    error that stops watch."""

    said: list[tuple[str, bool]] = field(default_factory=list)
    ingested: list[str] = field(default_factory=list)
    handed: bool = True
    verdicts: list[RunVerdict] | None = None
    trends: list[RunTrend] = field(default_factory=list)
    importer: DumpImporter | None = None
    checked: tuple[str, int] | None = None
    error: ProxauditError | None = None


@dataclass(frozen=True)
class Look:
    """Replay `entries` (imported first with `importer`) into the store at `db`, its runs' staleness
    sketches left unmerged for `Tidy`; then judge every run if a file went in, or if `judge` (watch has not
    judged yet), and the store exists. `checked`: the snapshot up to which an earlier look checked the
    store's values (`evaluator.store.checks.checked_up_to`)."""

    entries: tuple[Entry, ...]
    db: str
    importer: DumpImporter | None
    loss: Loss
    max_staleness: int | None
    thresholds: Thresholds | None
    interval: float
    judge: bool
    checked: tuple[str, int] | None = None
    kind = "look"

    @property
    def path(self) -> str:  # named in a failed look's error
        return f"into {self.db}"

    def run(self) -> LookResult:
        result = LookResult(importer=self.importer)
        return on_store(self.db, self.checked, result, lambda: self._look(result))

    def _look(self, result: LookResult) -> None:
        self._replay(result)
        if (result.ingested or self.judge) and locate(self.db).exists():
            self._judge(result)

    def _replay(self, result: LookResult) -> None:
        logs = [e.path for e in self.entries]
        if self.importer is not None:
            logs, lines = self.importer.convert(self.entries)
            result.said += [(line, False) for line in lines]
        if not logs:
            return

        def heard(outcome) -> None:
            result.said.append((outcome.line(), False))
            if outcome.status == "ingested":
                result.ingested.append(str(outcome.path))

        try:
            # in this process (a large file is summarised in threads here): no workers' memory on top
            report = replay(
                logs, self.db, on_file=heard, progress=False, loss=self.loss,
                max_staleness=self.max_staleness, workers=1, merge=False,
            )  # fmt: skip
        except UsageError as error:  # a file vanished between the listing and the replay
            result.said.append((f"{error}; looking again in {self.interval:g} s", True))
            result.handed = False
            return
        except NothingReadableError as error:  # reported; each is tried again when it changes
            result.said.append((str(error), True))
            return
        warnings = [f for f in report.findings if f.severity == "warning"]
        if warnings:  # stored with the run too (the gate and the dashboard show them)
            result.said.append(("\n".join(findings_lines(warnings)), False))

    def _judge(self, result: LookResult) -> None:
        thresholds = self.thresholds or default_thresholds()
        result.verdicts = judge_runs(self.db, thresholds, self.max_staleness)
        gate = gated(thresholds)
        if gate.method:
            result.trends = run_trends(self.db, gate.method, gate.tolerance, self.max_staleness)


@dataclass(frozen=True)
class Tidy:
    """After a look that ingested files, once its alerts are out: merge the staleness sketches of the runs
    of the store at `db` (`merge_run_sketches`: the judging read them unmerged, the same counts; with
    `grown`, only the runs whose new rows are at least as many as their merged ones), and with
    `merge_files` the small data files of the tables each look reads (`merge_small_files`). `checked` as
    `Look`'s: the result's `checked` is the snapshot checked after it."""

    db: str
    merge_files: bool
    checked: tuple[str, int] | None = None
    grown: bool = False
    kind = "tidy"

    @property
    def path(self) -> str:  # named in a failed tidying's error
        return f"of {self.db}"

    def run(self) -> LookResult:
        return on_store(self.db, self.checked, LookResult(), self._merge)

    def _merge(self) -> None:
        merge_run_sketches(self.db, self.grown)
        if self.merge_files:
            merge_small_files(self.db)


def on_store(
    db: str, checked: tuple[str, int] | None, result: LookResult, work: Callable[[], None]
) -> LookResult:
    """`result` once `work()` (a look's or a tidying's) is done on the store at `db`: the store's values
    trusted up to `checked` first, and after it the snapshot up to which they are checked (`checked` while
    there is no store); a `ProxauditError` (a store of another loss, ...) is its `error`: watch stops."""
    result.checked = checked
    trust_checked(checked)
    try:
        work()
        store = locate(db)
        if store.exists():
            result.checked = checked_up_to(store) or checked
    except ProxauditError as error:
        result.error = error
    return result


class LookProcess:
    """Runs each look and its tidying in a worker process (`evaluator.watch.look_worker`), a fresh one
    every `looks_per_process` looks; a look that fails unexpectedly, or whose process dies, is a
    `FileFailed`."""

    def __init__(self, looks_per_process: int = LOOKS_PER_PROCESS) -> None:
        self.looks_per_process = looks_per_process
        self._pool: WorkerPool | None = None
        self._looks = 0

    def run(self, look: Look | Tidy) -> LookResult:
        if self._pool is None or (look.kind == "look" and self._looks >= self.looks_per_process):
            self.close()
            self._pool = WorkerPool(1, module=LOOK_WORKER)
        self._looks += look.kind == "look"
        (result,) = self._pool.map([look])
        if isinstance(result, FileFailed):
            self.close(kill=True)
            raise result
        return result

    def close(self, kill: bool = False) -> None:
        """Stop the process: once its look is done, or at once (`kill`: Ctrl-C, an error)."""
        if self._pool is not None:
            self._pool.close(kill=kill)
        self._pool, self._looks = None, 0
