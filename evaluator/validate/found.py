"""What a call found before it reads anything: the folders its token logs are in and the runs each holds
(`validate` and `replay` print it first), and why a folder gave nothing.

A folder is searched with its subfolders (`find_parquet_files`), so `replay fixtures/` also takes the runs
of `fixtures/toy/`; saying so, folder by folder with their runs, before the work starts is the rule: to
leave a subfolder out, name the files (`fixtures/*.parquet`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from evaluator.logio import file_runs
from evaluator.sources import Staging, is_uri
from evaluator.text_table import printable
from evaluator.validate.hints import TOKEN_LOG_DOCS

RUNS_SHOWN = 6
RUN_CHARS = 60
"""A run_id is shown up to this many characters (validation refuses one past 200 bytes, naming it)."""


@dataclass
class Folder:
    """One folder (or object-storage prefix) of a call's files, as the user named it."""

    location: str
    files: int
    runs: tuple[str, ...]
    """Its files' runs, sorted (at most `RUNS_SHOWN + 1`: one more says there are others)."""

    def line(self) -> str:
        names = [
            printable(r if len(r) <= RUN_CHARS else f"{r[:RUN_CHARS]}...") for r in self.runs[:RUNS_SHOWN]
        ]
        runs = ", ".join(names) + (", ..." if len(self.runs) > RUNS_SHOWN else "")
        name = "run" if len(self.runs) == 1 else "runs"
        return f"{printable(self.location)}: {self.files:,} file{'s' * (self.files != 1)}" + (
            f", {name} {runs}" if runs else ""
        )


def found_folders(files: Sequence[Path], staging: Staging | None = None) -> list[Folder]:
    """The folders of `files` (where the user named them: a URI prefix for a staged copy), in the order
    their first file comes, each with its number of files and the runs their footers name."""
    by_folder: dict[str, tuple[int, set[str]]] = {}
    for path in files:
        where = staging.location(path) if staging is not None else path
        folder = f"{where.rsplit('/', 1)[0]}/" if isinstance(where, str) else f"{where.parent}/"
        count, runs = by_folder.get(folder, (0, set()))
        if len(runs) <= RUNS_SHOWN:
            runs |= set(file_runs(path, RUNS_SHOWN + 1))
        by_folder[folder] = (count + 1, runs)
    return [Folder(f, n, tuple(sorted(runs))[: RUNS_SHOWN + 1]) for f, (n, runs) in by_folder.items()]


def found_lines(folders: Sequence[Folder]) -> list[str]:
    """What a call says first: the folders and runs it found; with several folders, how to leave one out."""
    if len(folders) == 1:
        return [f"found {folders[0].line()}"]
    files = sum(f.files for f in folders)
    head = (
        f"found {files:,} files in {len(folders)} folders (a folder is searched with its subfolders: "
        f"name the files, e.g. {printable(folders[0].location)}*.parquet, to leave its subfolders out):"
    )
    return [head, *(f"  {f.line()}" for f in folders)]


def nothing_found(paths: Sequence[str | Path]) -> str:
    """Why `paths` gave no file: no `*.parquet` under them, with the other files seen there, if any (a CSV
    export, say) and where the format is described."""
    others = sorted(
        {
            p.name
            for raw in paths
            if not is_uri(raw) and Path(raw).is_dir()
            for p in Path(raw).rglob("*")
            if p.is_file() and not p.name.startswith((".", "_"))
        }
    )
    n = len(others)
    seen = (
        f" (they hold {n:,} other file{'s' * (n != 1)}: {', '.join(others[:3])}{', ...' * (n > 3)})"
        if n
        else ""
    )
    return f"no *.parquet files in {', '.join(map(str, paths))}{seen}: {TOKEN_LOG_DOCS}"
