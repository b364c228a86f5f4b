"""Listing the watched folders: every file under them (recursively) with its size, modification time and
last bytes (`evaluator.watch.completeness.Entry`), the last bytes read again only for a file that changed."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from evaluator.watch.completeness import TAIL_BYTES, Entry


def read_tail(path: Path, size: int) -> bytes:
    """The last `TAIL_BYTES` bytes of `path` (b"" when it vanished or cannot be read)."""
    try:
        with open(path, "rb") as source:
            source.seek(max(0, size - TAIL_BYTES))
            return source.read(TAIL_BYTES)
    except OSError:
        return b""


class Lister:
    """Lists the files under `paths` (a path that is a file is listed itself; one that does not exist yet,
    nothing), keeping each file's last bytes until its size or time changes."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = [Path(p) for p in paths]
        self._tails: dict[Path, tuple[int, int, bytes]] = {}

    def scan(self) -> list[Entry]:
        entries = []
        for root in self.paths:
            if root.is_file():
                entries.append(self._entry(root))
                continue
            for folder, _, names in os.walk(root):
                entries += [self._entry(Path(folder) / name) for name in names]
        entries = [e for e in entries if e is not None]
        self._tails = {e.path: (e.size, e.mtime_ns, e.tail) for e in entries}  # forget vanished files
        return entries

    def _entry(self, path: Path) -> Entry | None:
        try:
            stat = path.stat()
        except OSError:  # renamed or removed since the folder was read (the hook's temporary files)
            return None
        size, mtime = stat.st_size, stat.st_mtime_ns
        known = self._tails.get(path)
        tail = known[2] if known is not None and known[:2] == (size, mtime) else read_tail(path, size)
        return Entry(path, size, mtime, tail)
