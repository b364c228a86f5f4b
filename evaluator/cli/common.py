"""What every `proxaudit` command shares: the exit codes and how the library's errors become them."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from functools import wraps

import click

from evaluator.errors import ProxauditError
from evaluator.text_table import printable

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2
"""0 clean / pass, 1 a file broke a rule or a check failed, 2 usage error or nothing usable."""


def say(text: str, fmt: str = "table", err: bool = False) -> None:
    """Print a command's output: human formats with control characters from the data spelled out
    (`printable`); `json` escapes them itself; `csv` keeps the values exact for a program, and is spelled
    out too when it goes to a terminal (as `ls` quotes names only there)."""
    stream = sys.stderr if err else sys.stdout
    if fmt == "table" or (fmt == "csv" and stream.isatty()):
        text = printable(text, keep_lines=True)
    click.echo(text, err=err, color=True)  # click would strip escape sequences from a value into a pipe
    stream.flush()  # a line as it happens, also into a pipe (CI logs)


def terminal_width() -> int | None:
    """The width tables and sentences fit in: `COLUMNS` when set, the terminal's on a terminal, None (any)
    into a pipe or a file."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def library_errors(command: Callable) -> Callable:
    """Turn the library's named exceptions, and the file system's errors, into a one-line error and exit
    code 2 (a line break a path or a value from the data carries into the message is spelled out)."""

    @wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except ProxauditError as error:
            say(printable(f"proxaudit: error: {error}"), err=True)
            sys.exit(EXIT_USAGE)
        except OSError as error:  # a file the command writes or reads: a folder that is not writable, ...
            where = f": {error.filename}" if error.filename else ""
            say(printable(f"proxaudit: error: {error.strerror or error}{where}"), err=True)
            sys.exit(EXIT_USAGE)

    return wrapper
