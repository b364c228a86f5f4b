"""The input files of a replay before any is summarised: their digests (a file the store holds, from
where it is or as a copy; a byte copy of an earlier file of the call), whether any opens as Parquet at all,
and what becomes of a file that is not summarised (`Slot.resolve`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow.parquet as pq

from evaluator.errors import NothingReadableError
from evaluator.problems import Problem
from evaluator.replay.outcomes import FileOutcome
from evaluator.sources import Staging, recorded_location
from evaluator.store import file_digest
from evaluator.validate import CheckedFile, check_file


@dataclass(eq=False)
class Slot:
    """One input file through the phases: its digest, its check, and at last its outcome."""

    path: Path
    digest: str | None = None
    checked: CheckedFile | None = None
    copy_of: Slot | None = None
    """An earlier file of this call with the same bytes: this one shares its fate."""
    outcome: FileOutcome | None = None

    @property
    def to_check(self) -> bool:
        """Neither known from its digest nor a copy of an earlier file."""
        return self.outcome is None and self.copy_of is None

    @property
    def to_summarise(self) -> bool:
        """Checked, and it broke no rule (on its own or in the call)."""
        return self.checked is not None and self.checked.facts is not None

    def resolve(self) -> FileOutcome:
        """The outcome of a file that is not summarised: known from its digest or its check."""
        if self.copy_of is not None:
            first = self.copy_of.outcome
            if first.status in ("ingested", "already ingested", "copy"):  # in the store: a copy of it
                holder = first.copy_of if first.status == "copy" else self.copy_of.path
                return FileOutcome(self.path, "copy", copy_of=holder, resaved=first.resaved)
            return replace(first, path=self.path)
        report = self.checked.report
        status = "skipped" if report.readable else "unreadable"
        return FileOutcome(self.path, status, problems=report.problems)


def digests(files: list[Path], staging: Staging) -> list[Slot]:
    """A slot per file: unreadable, a byte copy of an earlier file, or to do (`stored` then marks those the
    store holds). `staging.digests`: the digests of copied objects, taken while they were downloaded."""
    slots, first = [], {}
    for path in files:
        slot = Slot(path)
        try:
            slot.digest = staging.digests.get(path) or file_digest(path)
        except OSError as error:  # permissions, a vanished file: reported like any unreadable file
            problem = Problem("unreadable", None, 0, f"cannot read it: {error}")
            slot.outcome = FileOutcome(path, "unreadable", problems=[problem])
        else:
            if slot.digest in first:
                slot.copy_of = first[slot.digest]
            else:
                first[slot.digest] = slot
        slots.append(slot)
    return slots


def stored(slots: list[Slot], known: dict[str, str], staging: Staging) -> list[Slot]:
    """Mark the slots whose file the store holds (`known`: the stored files' digests and paths): already
    ingested from where it is, or a copy of a stored file; a check made meanwhile is dropped. Those
    slots."""
    held = [slot for slot in slots if slot.digest in known]
    for slot in held:
        here, holder = recorded_location(staging.location(slot.path)), known[slot.digest]
        slot.outcome = (
            FileOutcome(slot.path, "already ingested")
            if here == holder
            else FileOutcome(slot.path, "copy", copy_of=holder)
        )
        slot.copy_of = slot.checked = None
    return held


def require_one_parquet(files: list[Path], staging: Staging) -> None:
    """`NothingReadableError`, saying why of each file, when not one of `files` opens as Parquet (a CSV,
    a truncated file): checked on the footers before the store is opened, so such a call leaves no store
    (and no folder) behind. Costs one footer read when the first file opens."""
    lines = []
    for path in files:
        try:
            pq.read_metadata(path)
            return
        except Exception:  # pyarrow raises several types; the validator says why in its own words
            report = check_file(path).report
            if report.readable:
                return
            lines.append(FileOutcome(staging.location(path), "unreadable", problems=report.problems).line())
    raise NothingReadableError("no input file could be read: " + "; ".join(lines))
