"""The watch loop: every `interval` seconds, list the watched folders, replay each newly complete file into
the store (a trainer's dump imported to a token log first), judge the runs again, and turn every change of
state into an alert; stop at the first `do_not_ship` (or drift) when asked, or once the folders fall idle.

Each complete file is handed to replay once per version of it (its size and time); replay skips a file
whose digest the store holds, so a restarted watch hands every file again and ingests only what is new,
and a file that other `replay` processes ingested (a store takes several writers at once) is not counted
twice. The alerts already written are read back at start, so a restart repeats none. Each look's replay
and judging, and its tidying once its alerts are out (`TIDY_AFTER`), run in a process of their own
(`evaluator.watch.look`), so watch's own memory stays flat. With
`tensorboard` or `wandb`, each look that judged (or found the run ended) writes the steps final by then
(`evaluator.watch.scalars`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from evaluator.formulas.loss import DEFAULT_LOSS, Loss
from evaluator.replay.groups import GROUP_FILES
from evaluator.store.lake import locate
from evaluator.watch.alerts import Alert, AlertMachine
from evaluator.watch.completeness import Entry, Split, split
from evaluator.watch.dumps import DumpImporter
from evaluator.watch.judge import RunVerdict
from evaluator.watch.listing import Lister
from evaluator.watch.look import Look, LookProcess, Tidy
from evaluator.watch.progress import Status, progress_text
from evaluator.watch.scalars import ScalarExport
from evaluator.watch.sinks import AlertsFile, Webhook, state
from evaluator.watch.trends import RunTrend
from schemas.thresholds import Thresholds

EXIT_ON = ("fail", "trend")
"""`fail`: stop at the first `do_not_ship` verdict; `trend`: at the first drift found (exit code 1)."""
FILES_PER_LOOK = GROUP_FILES
"""The most files one look replays (in path order, the step order of the hook's files; one group commit): a
watch that fell behind judges the run and raises its alerts after each such group, not once after the
whole backlog."""
TIDY_AFTER = 4
"""A look's tidying (its runs' staleness sketches merged, `evaluator.watch.look.Tidy`) runs after its alerts,
once no complete file waits for a look, or before watch exits. While files wait it is put off, so that watch
catches up sooner, for at most this many looks that ingested files (each judging reads every unmerged
file's sketch rows)."""
MERGE_EVERY = 20
"""Every this many tidyings (`evaluator.watch.look.Tidy`), the small data files of the tables looks read
are merged too (one per ingested file otherwise: a look late in a long run spent seconds opening them)."""


@dataclass(frozen=True)
class WatchOptions:
    paths: tuple[Path, ...]
    db: str | os.PathLike
    """the store: a folder, or a catalog URL"""
    importer: DumpImporter | None = None
    """a trainer's dump format to import (None: the folders hold token logs)"""
    alerts: Path | None = None
    webhook: str | None = None
    exit_on: frozenset[str] = frozenset()
    interval: float = 10.0
    """seconds between two looks at the folders"""
    idle_after: float = 600.0
    """no file changed for this long: an `idle` alert, and the run counts as ended"""
    until_idle: bool = False
    """stop once the run has ended and its last files are in"""
    thresholds: Thresholds | None = None
    """the gate's checks each run is judged by (None: the default thresholds)"""
    max_staleness: int | None = None
    """S, the trainer's maximum staleness: judged 1..S, recorded with the store (None: the log's)"""
    loss: Loss = DEFAULT_LOSS
    tensorboard: Path | None = None
    """write each run's final steps (`export`'s scalars) and the decision state as TensorBoard events here"""
    wandb: Path | None = None
    """the same as offline W&B runs here"""


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class Watcher:
    """The loop's state between two polls (`poll`), and the loop (`run`)."""

    def __init__(self, options: WatchOptions, status: Status, clock: Callable[[], float] = time.time) -> None:
        self.options, self.status, self.clock = options, status, clock
        self.fmt = options.importer.fmt if options.importer else "token-log"
        self.lister = Lister(options.paths)
        self.sink = AlertsFile(options.alerts) if options.alerts else None
        self.webhook = Webhook(options.webhook) if options.webhook else None
        self.machine = AlertMachine(state(options.alerts) if options.alerts else {})
        self.handed: dict[Path, tuple[int, int]] = {}
        self.signature: frozenset = frozenset()
        self.changed_at = clock()
        self.judged = False
        self.ingested, self.as_of = 0, None
        self.verdicts: list[RunVerdict] = []
        self.trends: list[RunTrend] = []
        scalars = options.tensorboard or options.wandb
        self.scalars = ScalarExport(options.db, options.tensorboard, options.wandb) if scalars else None
        self.exported_ended = False
        self.importer = options.importer
        """the dump importer, with the runs it has met (each look hands it over and takes it back)"""
        self.looks = LookProcess()
        self.untidy, self.tidied, self.unmerged = 1, 0, False
        """the looks since the last tidying that ingested files (their sketches still to merge: `_tidy`; 1 at
        start: a watch killed before its tidying left some); the tidyings; whether the last tidying merged
        only the runs whose new rows matched their merged ones (the final one merges the rest)"""
        self.checked: tuple[str, int] | None = None
        """the snapshot up to which a look checked the store's values (the next look, perhaps in a fresh
        process, reads only what came after it)"""

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, kind, *_) -> None:
        self.close(kill=kind is not None)

    def close(self, kill: bool = False) -> None:
        """Stop the looks' process (at once with `kill`: an error or Ctrl-C; the store is whole after a
        kill at any point) and close the scalar exports."""
        try:
            self.looks.close(kill=kill)
        finally:
            if self.scalars is not None:
                self.scalars.close()

    def run(self) -> int:
        """Poll until an exit condition holds; its exit code (0: the run ended, 1: `exit_on` fired)."""
        while True:
            started = self.clock()
            code = self.poll()
            if code is not None:
                return code
            time.sleep(max(0.0, self.options.interval - (self.clock() - started)))

    def poll(self) -> int | None:
        """One look at the folders: ingest, judge, alert; an exit code when watch should stop."""
        o, now = self.options, self.clock()
        entries = self.lister.scan()
        files = split(self.fmt, entries, ended=False)
        signature = frozenset((e.path, e.size, e.mtime_ns) for e in (*files.complete, *files.incomplete))
        if signature != self.signature:
            self.signature, self.changed_at = signature, now
        ended = now - self.changed_at >= o.idle_after
        parts = split(self.fmt, entries, ended=True) if ended else files
        due = [e for e in parts.complete if self.handed.get(e.path) != (e.size, e.mtime_ns)]
        new = due[:FILES_PER_LOOK]
        looked = bool(new) or (not self.judged and locate(o.db).exists())
        judged, alerts = self._look(new) if looked else (False, [])
        stored = locate(o.db).exists()
        alerts += self.machine.on_activity(ended, utc_now(), o.idle_after, [str(p) for p in o.paths])
        for alert in alerts:
            self._emit(alert)
        if self.scalars is not None and stored and (judged or ended != self.exported_ended):
            self.scalars.after_look(self.verdicts, self.trends, ended)  # the steps final by now
            self.exported_ended = ended
        self._show(parts, now)
        code = self._exit_code(ended, bool(new))
        final = code is not None
        due = self.untidy and (final or self.untidy >= TIDY_AFTER or not self._behind(ended))
        if stored and (due or (final and self.unmerged)):
            self._tidy(final)  # after the alerts: the merge does not delay them
        return code

    def _exit_code(self, ended: bool, looked_at_files: bool) -> int | None:
        """1 when `exit_on` fired, 0 when the run ended and its last files are in (`until_idle`)."""
        o = self.options
        if "fail" in o.exit_on and any(v.action == "do_not_ship" for v in self.verdicts):
            return 1
        if "trend" in o.exit_on and any(t.trend.drifting for t in self.trends):
            return 1
        if o.until_idle and ended and not looked_at_files:
            return 0
        return None

    def _behind(self, ended: bool) -> bool:
        """Is a complete file waiting for a look (the folders listed again: one may have come meanwhile)?"""
        files = split(self.fmt, self.lister.scan(), ended=ended)
        return any(self.handed.get(e.path) != (e.size, e.mtime_ns) for e in files.complete)

    def _look(self, new: Sequence[Entry]) -> tuple[bool, list[Alert]]:
        """Replay the newly complete files and judge the runs again, in the looks' process: (judged, the
        alerts)."""
        o = self.options
        look = Look(
            tuple(new), str(o.db), self.importer, o.loss, o.max_staleness, o.thresholds, o.interval,
            judge=not self.judged, checked=self.checked,
        )  # fmt: skip
        result = self.looks.run(look)
        self.checked = result.checked
        self.untidy += bool(result.ingested)
        for text, err in result.said:
            self.status.echo(text, err=err)
        if result.error is not None:
            raise result.error
        self.importer = result.importer
        if result.handed:
            self.handed.update({e.path: (e.size, e.mtime_ns) for e in new})
        self.ingested += len(result.ingested)
        self.as_of = result.ingested[-1] if result.ingested else self.as_of
        if result.verdicts is None:
            return False, []
        self.verdicts, self.trends, self.judged = result.verdicts, result.trends, True
        now = utc_now()
        on_verdicts = self.machine.on_verdicts(self.verdicts, now, self.as_of)
        return True, on_verdicts + self.machine.on_trends(self.trends, now, self.as_of)

    def _tidy(self, final: bool) -> None:
        """Merge the sketches of the files the last look ingested (`Tidy`), in the looks' process; every
        `MERGE_EVERY` tidyings the small data files too. While the run goes on, a run's sketch is merged
        once its new rows are as many as its merged ones (each merge rewrites the run's whole sketch, which
        grows with the run); the first tidying (what a killed watch left) and the `final` one, before watch
        exits, merge every run's, as a clean replay leaves them."""
        first = self.tidied == 0
        self.tidied += 1
        merge_files = self.tidied % MERGE_EVERY == 0
        self.unmerged = not (first or final)
        tidy = Tidy(str(self.options.db), merge_files, self.checked, grown=self.unmerged)
        result = self.looks.run(tidy)
        self.checked, self.untidy = result.checked, 0
        if result.error is not None:
            raise result.error

    def _emit(self, alert: Alert) -> None:
        self.status.echo(f"alert: {alert.text()}")
        if self.sink is not None:
            self.sink.append(alert)
        if self.webhook is not None:
            failed = self.webhook.post(alert)
            if failed:
                self.status.echo(f"warning: --webhook: the alert was not delivered: {failed}", err=True)

    def _show(self, parts: Split, now: float) -> None:
        complete, incomplete = len(parts.complete), len(parts.incomplete)
        since = now - self.changed_at if self.signature else None
        text, key = progress_text(self.options.paths, self.fmt, complete, incomplete, self.ingested, since)
        self.status.show(text, key)


def watch(options: WatchOptions, status: Status | None = None) -> int:
    """Follow `options.paths` into `options.db` until an exit condition (Ctrl-C raises KeyboardInterrupt):
    1 when `exit_on` fired, 0 when the run ended (`until_idle`)."""
    status = status or Status()
    try:
        with Watcher(options, status) as watcher:
            return watcher.run()
    finally:
        status.close()
