"""The files a command writes beside its terminal output (`gate --junit/--markdown/--json`): checked when the
options are parsed, so a path that cannot hold a report is a usage error naming its option (exit 2) before
any work is done or anything is printed."""

from __future__ import annotations

import os
from pathlib import Path

import click

EMPTY_HINT = (
    "an empty path: give a file name (a CI variable such as $GITHUB_STEP_SUMMARY is empty outside its CI: "
    "leave the option out there)"
)


class ReportFile(click.ParamType):
    """A file to write: not empty, not a folder (an existing one, or a name ending in `/`), and under a
    folder this process may write in (missing folders are created when the report is written)."""

    name = "file"

    def convert(self, value, param, ctx) -> str:
        text = os.fspath(value)
        if not text.strip():
            self.fail(EMPTY_HINT, param, ctx)
        path = Path(text)
        if text.endswith(("/", os.sep)) or path.is_dir():
            self.fail(f"{text}: a folder, not a file", param, ctx)
        if path.exists():
            if not os.access(path, os.W_OK):
                self.fail(f"{text}: not writable", param, ctx)
            return text
        folder = next(p for p in path.absolute().parents if p.exists())
        if not folder.is_dir():
            self.fail(f"{text}: {folder} is a file, not a folder", param, ctx)
        if not os.access(folder, os.W_OK | os.X_OK):
            self.fail(f"{text}: cannot write in {folder}", param, ctx)
        return text
