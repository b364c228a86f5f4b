"""What a user hands proxaudit, bounded before anything uses it: a number is finite and within the range
its parameter allows (`Range`); a config, thresholds or loss file is a regular file of at most 1 MiB read
whole (`read_text`); a dump is a regular file read one line at a time, each line at most 64 MiB
(`bounded_lines`). A FIFO, a device or a folder, also behind a symlink, is refused when it is opened,
before a byte is read. `shown` writes any value in an error message in a few dozen characters."""

from __future__ import annotations

import math
import os
import reprlib
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from evaluator.errors import InputFileError, ParameterError

MiB = 1 << 20
CONFIG_BYTES = MiB
"""The bound on a config, thresholds or loss file (a trainer's whole experiment config is a few KB)."""
LINE_BYTES = 64 * MiB
"""The bound on one line of a dump (a 128k-token sequence's per-token arrays take about 15 MB)."""

_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 60


def shown(value: object) -> str:
    """`value` for an error message in at most about 60 characters; a container by its type and size
    (never its repr, which a YAML alias bomb makes exponential), an integer past 64 bits by its size."""
    if isinstance(value, dict | list | tuple | set):
        return f"a {type(value).__name__} of {len(value)} items"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    return _SHORT.repr(value)


@dataclass(frozen=True)
class Range:
    """The values a numeric parameter allows: a finite number above `low` and below `high` (None:
    unbounded), strictly where `*_open`."""

    low: float | None = None
    high: float | None = None
    low_open: bool = True
    high_open: bool = True

    def __str__(self) -> str:
        low = None if self.low is None else f"{'>' if self.low_open else '>='} {self.low:g}"
        high = None if self.high is None else f"{'<' if self.high_open else '<='} {self.high:g}"
        if low and high:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"in {left}{self.low:g}, {self.high:g}{right}"
        return low or high or "a finite number"

    def contains(self, x: float) -> bool:
        above = self.low is None or (x > self.low if self.low_open else x >= self.low)
        below = self.high is None or (x < self.high if self.high_open else x <= self.high)
        return above and below

    def check(self, key: str, value: object) -> float:
        """`value` as a float, or a `ParameterError` naming `key` and this range: a bool, a string, NaN, an
        infinity or a number outside the range."""
        x = finite(key, value)
        if not self.contains(x):
            raise ParameterError(key, f"{shown(value)} must be {self}")
        return x


FINITE = Range()
"""Any finite number."""


def finite(key: str, value: object) -> float:
    """`value` as a finite float, or a `ParameterError` naming `key` (the type is checked before any repr
    of the value is built)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ParameterError(key, f"{shown(value)} must be a finite number")
    try:
        x = float(value)
    except OverflowError:
        x = math.inf
    if not math.isfinite(x):
        raise ParameterError(key, f"{shown(value)} must be a finite number")
    return x


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def open_regular(path: str | os.PathLike, what: str) -> BinaryIO:
    """`path` opened for reading in binary, when it is a regular file (after symlinks); anything else is
    an `InputFileError` naming the path, `what` it was given as and what it is. A FIFO is opened without
    waiting for a writer, so it is refused at once."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        raise InputFileError(f"{path}: {what} not found") from None
    except OSError as error:
        raise InputFileError(f"{path}: cannot open the {what}: {error.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise InputFileError(f"{path}: the {what} is {kind}, not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_text(path: str | os.PathLike, what: str, limit: int = CONFIG_BYTES) -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes (`open_regular`); a larger file is an
    `InputFileError` that says the bound, after reading no more than it."""
    with open_regular(path, what) as source:
        data = source.read(limit + 1)
    if len(data) > limit:
        raise InputFileError(f"{path}: the {what} is larger than {_size(limit)}, the bound on a {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputFileError(
            f"{path}: the {what} is not UTF-8 text ({error.reason} at byte {error.start})"
        ) from None


def bounded_lines(source: BinaryIO, path: str | Path, limit: int = LINE_BYTES) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of each line of `source`, read one at a time; a line longer than `limit`
    bytes is an `InputFileError` naming `path` and the line, after reading no more than the bound."""
    line_no = 0
    while line := source.readline(limit + 1):
        line_no += 1
        if len(line) > limit and not line.endswith(b"\n"):
            raise InputFileError(
                f"{path}: line {line_no} is longer than {_size(limit)}, the bound on one line"
            )
        yield line_no, line


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n % MiB == 0 else f"{n:,} bytes"
