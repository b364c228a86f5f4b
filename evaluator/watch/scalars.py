"""Watch's incremental export: after each look, the steps of each run that became final, written to
TensorBoard event files (`--tensorboard DIR`) or an offline W&B run (`--wandb DIR`) with the tags and
values `proxaudit export` writes for them (`evaluator.export`), and the decision state watch judged at
that look under `watch/` (`action` as a number, `max_staleness`, `drifting`).

A step is final once every folder the run's files came from (one per rank's hook) holds a later step of
the run, or once the run has ended (the folders idle): a step whose rows span files is written whole. Each
DIR keeps a record of the last step written per run (`RECORD`, replaced atomically once a look's scalars
are flushed); a restarted watch goes on after it, so no step is written twice.
"""

from __future__ import annotations

import importlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from evaluator.errors import UsageError
from evaluator.export import RunSeries, add_scalars, log_steps, run_folder, run_series
from evaluator.store import open_store
from evaluator.watch.judge import RunVerdict
from evaluator.watch.trends import RunTrend

ACTION_CODE = {"ship": 0, "undecided": 1, "ship_up_to": 2, "do_not_ship": 3}
"""`watch/action`: the verdict as a number, higher is worse (an alarm is a step up in the chart)."""
RECORD = "proxaudit-watch-{kind}.json"
"""The record in DIR: `{"runs": {run_id: {"step": the last step written, ...}}}`; TensorBoard's also names
the run's event file and its length then (`events`, `bytes`), W&B's the run's id (`wandb_id`)."""
EVENTS = "events.out.tfevents.*"
WANDB_PROJECT = "proxaudit"


class Record:
    """What was written into one DIR: per run, the last step and (W&B) the run's id. Made at start: a DIR
    that cannot be made or written, or a record that is not one, is a `UsageError` naming it."""

    def __init__(self, folder: Path, option: str, kind: str) -> None:
        self.path = Path(folder) / RECORD.format(kind=kind)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.path.parent):
                pass
        except OSError as error:
            raise UsageError(f"{option} {folder}: cannot write there ({error.strerror or error})") from None
        self.runs: dict[str, dict] = {}
        if self.path.exists():
            self.runs = _read_record(self.path)

    def last(self, run_id: str) -> int:
        return self.runs.get(run_id, {}).get("step", -1)

    def commit(self, run_id: str, **fields) -> None:
        """Record `fields` of `run_id` (`step`: the last step written, ...), atomically and durably."""
        self.runs.setdefault(run_id, {}).update(fields)
        temporary = self.path.with_name(f".{self.path.name}.tmp")
        with open(temporary, "w", encoding="utf-8") as out:
            json.dump({"runs": self.runs}, out, allow_nan=False)
            out.flush()
            os.fsync(out.fileno())
        temporary.replace(self.path)


def _read_record(path: Path) -> dict[str, dict]:
    try:
        runs = json.loads(path.read_text(encoding="utf-8"))["runs"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as error:
        raise UsageError(f"{path}: not watch's record of the steps written ({error})") from None
    if not isinstance(runs, dict):
        raise UsageError(f"{path}: `runs` must be an object of run_id -> the last step written")
    for run_id, known in runs.items():
        if not isinstance(known, dict) or type(known.get("step")) is not int:
            raise UsageError(f"{path}: runs.{run_id}: `step` must be the last step written (an integer)")
    return runs


def _library(module: str, option: str) -> ModuleType:
    """The export extra's `module`, or a `UsageError` saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UsageError(f"{option} needs {module}: pip install 'proxaudit[export]'") from None


class TensorBoardSink:
    """One event file per run and watch under `DIR/{run_folder(run_id)}`, as `export` names the folders.
    The record holds each run's current event file and its length at the last step recorded: at start,
    whatever a watch killed between a flush and its record appended past that length is cut off."""

    def __init__(self, folder: Path) -> None:
        self.make = _library("tensorboard.summary", "--tensorboard").Writer
        self.folder, self.writers = Path(folder), {}
        self.record = Record(self.folder, "--tensorboard", "tensorboard")
        for run_id, known in self.record.runs.items():
            name, length = known.get("events"), known.get("bytes")
            if not (isinstance(name, str) and name == Path(name).name and name.startswith(EVENTS[:-1])):
                raise UsageError(f"{self.record.path}: runs.{run_id}.events: not the name of an event file")
            if type(length) is not int:
                raise UsageError(f"{self.record.path}: runs.{run_id}.bytes: must be a length (an integer)")
            events = self.folder / run_folder(run_id) / name
            if events.is_file() and events.stat().st_size > length:
                os.truncate(events, length)

    def write(self, run: RunSeries, step: int) -> None:
        folder = self.folder / run_folder(run.run_id)
        writer = self.writers.get(run.run_id)
        if writer is None:
            before = set(folder.glob(EVENTS))
            writer = self.writers[run.run_id] = self.make(str(folder))
            (events,) = set(folder.glob(EVENTS)) - before
            last = self.record.last(run.run_id)
            self.record.commit(run.run_id, step=last, events=events.name, bytes=events.stat().st_size)
        add_scalars(writer, run)
        writer.flush()
        events = folder / self.record.runs[run.run_id]["events"]
        self.record.commit(run.run_id, step=step, bytes=events.stat().st_size)

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()


class WandbSink:
    """One offline W&B run per run under DIR (`wandb sync DIR/wandb/offline-run-*` uploads them); a
    restarted watch resumes the same W&B run (its id in the record) in a new offline folder."""

    def __init__(self, folder: Path) -> None:
        self.wandb = _library("wandb", "--wandb")
        self.folder, self.runs = Path(folder), {}
        self.record = Record(self.folder, "--wandb", "wandb")

    def write(self, run: RunSeries, step: int) -> None:
        wb = self.runs.get(run.run_id)
        if wb is None:
            wb = self.runs[run.run_id] = self.wandb.init(
                project=WANDB_PROJECT, name=run.run_id, dir=str(self.folder), mode="offline",
                id=self.record.runs.get(run.run_id, {}).get("wandb_id"), resume="allow", reinit="create_new",
                config={"proxaudit_run_id": run.run_id}, settings=self.wandb.Settings(quiet=True),
            )  # fmt: skip
        log_steps(wb, run)
        self.record.commit(run.run_id, step=step, wandb_id=wb.id)

    def close(self) -> None:
        for wb in self.runs.values():
            wb.finish()


def decision_state(
    run_id: str, step: int, verdicts: Sequence[RunVerdict], trends: Sequence[RunTrend]
) -> dict[str, tuple[list[int], list[float]]]:
    """The `watch/` scalars of one run at `step`: its verdict's action and max staleness, and how many of
    its trends are drifting (none before its first verdict)."""
    verdict = next((v for v in verdicts if v.run_id == run_id), None)
    if verdict is None:
        return {}
    state = {"watch/action": ACTION_CODE[verdict.action]}
    if verdict.max_staleness is not None:
        state["watch/max_staleness"] = verdict.max_staleness
    state["watch/drifting"] = sum(t.trend.drifting for t in trends if t.run_id == run_id)
    return {tag: ([step], [float(value)]) for tag, value in state.items()}


FINAL_STEPS = r"""
SELECT run_id, min(folder_last) - 1 FROM (
    SELECT t.run_id, regexp_replace(f.path, '[/\\][^/\\]*$', '') AS folder, max(t.step) AS folder_last
    FROM file_tokens t JOIN ingested_file f USING (file_id)
    GROUP BY ALL
) GROUP BY run_id
"""


def final_steps(db: str | os.PathLike) -> dict[str, int]:
    """Each run's last final step while it runs: the step before the one every folder of its files has
    reached (one hook per rank writes one folder each: a rank a step behind holds the others back)."""
    with open_store(db) as con:
        return dict(con.execute(FINAL_STEPS).fetchall())


class ScalarExport:
    """The sinks of one watch, and what each look writes to them."""

    def __init__(self, db: str | os.PathLike, tensorboard: Path | None, wandb: Path | None) -> None:
        self.db = db
        self.sinks = [*([TensorBoardSink(tensorboard)] if tensorboard else []),
                      *([WandbSink(wandb)] if wandb else [])]  # fmt: skip

    def after_look(self, verdicts: Sequence[RunVerdict], trends: Sequence[RunTrend], ended: bool) -> None:
        """Write each run's newly final steps (every step once the run `ended`) to each sink, with the
        decision state at the last of them."""
        start = min((s.record.last(v.run_id) for s in self.sinks for v in verdicts), default=-1) + 1
        finals = {} if ended else final_steps(self.db)  # before the series: a snapshot no newer than theirs
        for run in run_series(self.db, from_step=start):
            final = run.last_step() if ended else finals.get(run.run_id, -1)
            for sink in self.sinks:
                new = run.between(sink.record.last(run.run_id), final)
                if new.series:
                    step = new.last_step()
                    state = decision_state(run.run_id, step, verdicts, trends)
                    sink.write(RunSeries(run.run_id, new.series | state), step)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
