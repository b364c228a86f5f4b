"""A trainer's dump files, once complete, imported into token logs (the importers of `proxaudit import`),
which `watch` then replays. Each folder the trainer wrote a run's dump into is one run, named after it (or
`--run-id` when the paths hold one run), as `proxaudit import` names it (`evaluator.importers.runs`). An
import writes the same bytes for the same dump file, and a log imported before (newer than its dump file)
is kept, so a restart of `watch` converts nothing twice and replay finds each log's digest already in the
store."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path

from evaluator.importers import FORMATS
from evaluator.importers.rows import ImportFormatError
from evaluator.importers.runs import dump_runs, run_folder
from evaluator.importers.slime_versions import Versions
from evaluator.text_table import printable
from evaluator.watch.completeness import Entry


class DumpImporter:
    """Imports dump files of format `fmt` into `out`, each run folder as its own run (`run_id`: the name
    of the one run the paths may hold; `trust_pickle`: SkyRL's pickles may be read; `versions`: slime's
    weight pushes). A value that pickles with what it has met: watch's looks hand it to their process and
    take it back."""

    def __init__(
        self,
        fmt: str,
        out: Path,
        run_id: str | None = None,
        *,
        trust_pickle: bool = False,
        versions: Versions | None = None,
    ) -> None:
        module = FORMATS[fmt]
        self.fmt, self.out, self.run_id = fmt, Path(out), run_id
        self._convert = module.convert
        if fmt == "skyrl":
            self._convert = partial(module.convert, trust_pickle=trust_pickle)
        elif fmt == "slime":
            self._convert = partial(module.convert, versions=versions or Versions())
        self._sources: dict[str, Path] = {}
        self._firsts: dict[Path, Path] = {}
        """a dump file of each run folder met so far"""

    @property
    def module(self):
        """The importer module of the format (`evaluator.importers`)."""
        return FORMATS[self.fmt]

    def run_of(self, path: Path) -> str:
        """The run_id of a dump file: its run folder's name (or `run_id`), checked against the runs met
        before (an `ImportFormatError` when `run_id` would name two runs, or two folders one run)."""
        folder = run_folder(self.fmt, path)
        runs = dump_runs(self.fmt, [*self._firsts.values(), path], self.run_id)
        self._firsts.setdefault(folder, path)
        return next(r.run_id for r in runs if r.folder == folder)

    def convert(self, entries: Sequence[Entry]) -> tuple[list[Path], list[str]]:
        """(the token logs of `entries`, in order; a line per dump file that failed or was skipped)."""
        logs, lines = [], []
        for entry in entries:
            path, shown = entry.path, printable(str(entry.path))
            try:
                run_id = self.run_of(path)
            except ImportFormatError as error:
                lines.append(f"{shown}: not imported: {printable(str(error))}")
                continue
            name = self.module.out_name(path, run_id)
            first = self._sources.setdefault(name, path)
            if first != path:
                why = f"its log would replace that of {printable(str(first))} (two runs' dumps)"
                lines.append(f"{shown}: not imported: {why}")
                continue
            log = self.out / name
            if log.exists() and log.stat().st_mtime_ns >= entry.mtime_ns:
                logs.append(log)  # imported by an earlier watch: the same bytes
                continue
            try:
                result = self._convert(path, self.out, run_id)
            except (ImportFormatError, OSError) as error:
                lines.append(f"{shown}: not imported: {printable(str(error).removeprefix(f'{path}: '))}")
                continue
            if result.out is None:
                lines.append(f"{shown}: nothing to import (no token in the loss)")
                continue
            lines += [f"{shown}: note: {printable(note)}" for note in sorted(result.notes)]
            logs.append(result.out)
        return logs, lines
