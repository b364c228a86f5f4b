"""The progress line: what `watch` is waiting for (which folders, how many files complete and still being
written, how long since a file last changed), on stderr. On a terminal it is one line rewritten in place
(tqdm's status bar, which the lines printed above it leave alone); elsewhere (a log file, CI) it is printed
as a line when the counts change."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from evaluator.text_table import printable

FORMAT_NAMES = {
    "token-log": "token logs",
    "nemo-rl": "NeMo-RL dumps",
    "prime-rl": "prime-rl exports",
    "slime": "slime dumps",
    "skyrl": "SkyRL dumps",
}


def progress_text(
    paths: Sequence[Path],
    fmt: str,
    complete: int,
    incomplete: int,
    ingested: int,
    since_change_s: float | None,
) -> tuple[str, tuple]:
    """(the line, what it says without the time: a non-terminal prints the line when that changes)."""
    missing = [str(p) for p in paths if not p.exists()]
    where = ", ".join(str(p) for p in paths)
    counts = (complete, incomplete, ingested, tuple(missing))
    if missing:
        return f"waiting for {', '.join(missing)} to appear (the trainer creates it)", counts
    text = (
        f"waiting for {FORMAT_NAMES[fmt]} in {where}: {complete} complete ({ingested} ingested by this "
        f"watch), {incomplete} being written"
    )
    if since_change_s is not None:
        text += f"; last change {since_change_s:.0f} s ago"
    return text, counts


class Status:
    """The progress line on stderr, and the lines `watch` prints (stdout, or stderr for `err`) above it."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.live = sys.stderr.isatty() if enabled is None else enabled
        self.bar = tqdm(total=0, bar_format="{desc}", file=sys.stderr, disable=not self.live, leave=False)
        self._said: tuple | None = None

    def show(self, text: str, key: tuple) -> None:
        if self.live:
            self.bar.set_description_str(text)
        elif key != self._said:
            print(text, file=sys.stderr, flush=True)
        self._said = key

    def echo(self, line: str, err: bool = False) -> None:
        """Print `line` above the progress line, control characters spelled out (`printable`): an error
        (`err`) is one line, its line breaks too."""
        stream = sys.stderr if err else sys.stdout
        tqdm.write(printable(line, keep_lines=not err), file=stream)
        stream.flush()

    def close(self) -> None:
        self.bar.close()
