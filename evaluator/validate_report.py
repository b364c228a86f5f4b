"""Rendering of validation reports: a readable table (one block per file) or JSON for machines."""

from __future__ import annotations

import json
from collections.abc import Sequence

from evaluator.problems import FileReport
from evaluator.text_table import aligned_lines

_HEADER = ("rule", "column", "rows", "message")


def report_dict(reports: Sequence[FileReport]) -> dict:
    """`{"files": [{path, n_rows, ok, readable, problems: [...], notes: [...]}], "summary": {...}}`."""
    files = [
        {
            "path": str(r.path),
            "n_rows": r.n_rows,
            "ok": r.ok,
            "readable": r.readable,
            "problems": [
                {"rule": p.rule, "column": p.column, "rows": p.rows, "message": p.message} for p in r.problems
            ],
            "notes": list(r.notes),
        }
        for r in reports
    ]
    return {"files": files, "summary": _counts(reports)}


def render_json(reports: Sequence[FileReport]) -> str:
    return json.dumps(report_dict(reports), indent=2)


def render_table(reports: Sequence[FileReport], *, verbose: bool = False) -> str:
    """One block per file (problems as rule, column, rows, message; rows `-` where the rule is not
    row-based), then a line of counts.
    `verbose` adds the notes: what the alignment audit compared, sampling, inconclusive checks."""
    blocks = [_file_block(r, verbose) for r in reports]
    return "\n\n".join([*blocks, summary_line(reports)])


def summary_line(reports: Sequence[FileReport]) -> str:
    c = _counts(reports)
    return (
        f"{c['files']} file{'s' if c['files'] != 1 else ''}: {c['clean']} clean, "
        f"{c['with_problems']} with problems, {c['unreadable']} unreadable"
    )


def _counts(reports: Sequence[FileReport]) -> dict[str, int]:
    return {
        "files": len(reports),
        "clean": sum(r.ok for r in reports),
        "with_problems": sum(r.readable and not r.ok for r in reports),
        "unreadable": sum(not r.readable for r in reports),
    }


def _file_block(report: FileReport, verbose: bool) -> str:
    rows = "? rows" if report.n_rows is None else f"{report.n_rows:,} rows"
    if not report.readable:
        verdict = "UNREADABLE"
    elif report.ok:
        verdict = "ok"
    else:
        verdict = f"{len(report.problems)} problem{'s' if len(report.problems) != 1 else ''}"
    lines = [f"{report.path}  ({rows})  {verdict}"]
    if report.problems:
        table = [_HEADER] + [
            (p.rule, p.column or "-", f"{p.rows:,}" if p.rows else "-", p.message) for p in report.problems
        ]
        lines += [f"  {line}" for line in aligned_lines(table, right={2})]  # row counts on the right
    if verbose:
        lines += [f"  note: {note}" for note in report.notes]
    return "\n".join(lines)
