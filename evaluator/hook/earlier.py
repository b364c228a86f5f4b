"""The token logs that earlier hooks of a run wrote into its folder, as a new hook of the run sees them:
where to continue (the next file number, the next fresh `seq_id`) and which steps they hold, so that a
training restarted under the same `run_id` is warned about instead of found by replay's duplicate rule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


class RunIdReusedWarning(UserWarning):
    """A hook records steps its run's earlier files already hold: a second training under one run_id."""


def run_files(out_dir: str | Path, run_id: str) -> list[Path]:
    """The token log files a hook of `run_id` wrote into `out_dir` (a new hook numbers its files after
    them, as a trainer resumed from a checkpoint continues its run)."""
    pattern = re.compile(rf"^{re.escape(run_id)}-step\d+-\d+-\d+\.parquet$")
    out_dir = Path(out_dir)
    return sorted(p for p in out_dir.iterdir() if pattern.match(p.name)) if out_dir.is_dir() else []


def _max_seq_id(path: Path) -> int:
    """The largest seq_id of a file: from its row groups' statistics, else its column; -1 for a file that
    is no token log (unreadable, no seq_id): replay cannot count its tokens either."""
    try:
        meta = pq.read_metadata(path)
        column = meta.schema.names.index("seq_id")
        stats = [meta.row_group(i).column(column).statistics for i in range(meta.num_row_groups)]
        if all(s is not None and s.has_min_max for s in stats):
            return max((s.max for s in stats), default=-1)
        top = pc.max(pq.read_table(path, columns=["seq_id"])["seq_id"]).as_py()
    except (OSError, ValueError, pa.ArrowException):
        return -1
    return -1 if top is None else top


@dataclass(frozen=True)
class EarlierFiles:
    """What a run's files in a folder tell a new hook of the run."""

    out_dir: Path
    run_id: str
    files: tuple[Path, ...]
    next_file: int
    """The number of the next file (`{run_id}-step..-..-{n:04d}.parquet`)."""
    next_seq_id: int
    """The first fresh seq_id: after every seq_id of the files (a resumed run keeps its tokens apart)."""
    steps: tuple[int, int] | None
    """First and last step the files hold (from their names), None without files."""

    @classmethod
    def scan(cls, out_dir: str | Path, run_id: str) -> EarlierFiles:
        files = tuple(run_files(out_dir, run_id))
        parts = [p.stem.rsplit("-", 3)[1:] for p in files]  # step{first}, last, n
        steps = (min(int(s[0][4:]) for s in parts), max(int(s[1]) for s in parts)) if parts else None
        next_seq_id = 1 + max((_max_seq_id(p) for p in files), default=-1)
        next_file = 1 + max((int(s[2]) for s in parts), default=-1)
        return cls(Path(out_dir), run_id, files, next_file, next_seq_id, steps)

    def restart(self, step: int) -> str | None:
        """The warning for a first recorded `step` at or before the last step the files hold, else None."""
        if self.steps is None or step > self.steps[1]:
            return None
        first, last = self.steps
        return (
            f"{self.out_dir} already holds steps {first}..{last} of run {self.run_id!r} ({len(self.files)} "
            f"files), and this hook records step {step} again: replay would refuse the repeated tokens "
            "(duplicate_across_files) or count those steps twice. A new training needs a new run_id (or "
            "out_dir); a run resumed from a checkpoint before the last logged step, its files past the "
            "checkpoint removed first"
        )
