"""Which run each dump file belongs to, and its `run_id`, decided before anything is written.

A trainer writes one run's dump under the folder it was given: NeMo-RL's `log_dir`, prime-rl's
`output_dir` (`token_exports/` inside it), slime's `--dump-details` folder, SkyRL's `export_path`
(`dumped_data/` inside it). That folder is the run: a folder given to `proxaudit import` is searched with
its subfolders, and each run folder found is imported as its own run, named after the folder, never after
the name the trainer gives every dump (`token_exports`, `dumped_data`). prime-rl's multi-run exports
(`TokenExporter._export_dir`, PrimeIntellect-ai/prime-rl at 004274e) write `{run_id}/token_exports/`, so
there the folder's name is the dump's own `run_id` (which its rows keep). `--run-id` names the run when
the paths hold one; two runs that would get one name are refused, naming both folders.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from evaluator.importers.rows import ImportFormatError


@dataclass(frozen=True)
class Layout:
    depth: int
    """Folders between a dump file and the folder holding the run's dump (0: the file's own folder)."""
    fixed: str | None = None
    """The name the trainer gives that folder in every run; the run is then the folder above it."""


LAYOUTS = {
    "nemo-rl": Layout(0),  # {log_dir}/train_data_step{N}.jsonl
    "prime-rl": Layout(1, "token_exports"),  # {output_dir}/token_exports/step_{N}/rank_{R}.jsonl
    "slime": Layout(1),  # {dump_details}/train_data/{rollout_id}[_{rank}].pt
    "skyrl": Layout(0, "dumped_data"),  # {export_path}/dumped_data/global_step_{N}_training_input.pkl
}


@dataclass
class DumpRun:
    """One run's dump files (in the order the format sorts them) and the `run_id` its rows get."""

    folder: Path
    run_id: str
    files: list[Path]

    def where(self) -> str:
        """The folder (relative to the working folder when under it) and its number of files."""
        shown = os.path.relpath(self.folder)
        n = len(self.files)
        return f"{self.folder if shown.startswith('..') else shown}/ ({n:,} file{'s' * (n != 1)})"


def run_folder(fmt: str, path: Path) -> Path:
    """The folder the trainer wrote the run's dump into."""
    layout = LAYOUTS[fmt]
    folder = path.absolute().parents[layout.depth]
    return folder.parent if folder.name == layout.fixed else folder


def dump_runs(fmt: str, files: Sequence[Path], run_id: str | None = None) -> list[DumpRun]:
    """`files` (each once) grouped by run folder, each run named `run_id` or its folder's name. An
    `ImportFormatError` when `run_id` is given for several runs, or two runs would share a name."""
    runs: dict[Path, DumpRun] = {}
    seen: set[Path] = set()
    for path in files:
        if path.resolve() in seen:
            continue
        seen.add(path.resolve())
        folder = run_folder(fmt, path)
        runs.setdefault(folder, DumpRun(folder, run_id or folder.name, [])).files.append(path)
    ordered = sorted(runs.values(), key=lambda r: r.folder)
    if run_id is not None and len(ordered) > 1:
        found = ", ".join(r.where() for r in ordered)
        raise ImportFormatError(
            f"--run-id {run_id} names one run, and the paths hold the dumps of {len(ordered)} runs: {found}; "
            "import each folder with its own --run-id, or leave --run-id out to name each run after its "
            "folder"
        )
    by_name: dict[str, list[DumpRun]] = {}
    for run in ordered:
        by_name.setdefault(run.run_id, []).append(run)
    twins = [same for same in by_name.values() if len(same) > 1]
    if twins:
        folders = " and ".join(r.where() for r in twins[0])
        raise ImportFormatError(
            f"the dumps in {folders} would all be run {twins[0][0].run_id}: import each folder with its own "
            "--run-id"
        )
    return ordered
