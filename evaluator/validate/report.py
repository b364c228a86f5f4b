"""Rendering of validation reports: a readable table (one block per file) or JSON for machines."""

from __future__ import annotations

import json
from collections.abc import Sequence

from evaluator.problems import FileReport, Finding
from evaluator.text_table import aligned_lines

_HEADER = ("rule", "column", "rows", "message")


def report_dict(reports: Sequence[FileReport], findings: Sequence[Finding] = ()) -> dict:
    """`{"files": [{path, n_rows, ok, readable, problems: [...], notes: [...]}], "runs": [{run_id,
    findings: [{rule, severity, column, rows, message}]}], "summary": {...}}`."""
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
    runs: dict[str, list] = {}
    for f in findings:
        runs.setdefault(f.run_id, []).append(
            {"rule": f.rule, "severity": f.severity, "column": f.column, "rows": f.rows, "message": f.message}
        )
    runs_list = [{"run_id": run, "findings": found} for run, found in runs.items()]
    return {"files": files, "runs": runs_list, "summary": _counts(reports, findings)}


def render_json(reports: Sequence[FileReport], findings: Sequence[Finding] = ()) -> str:
    return json.dumps(report_dict(reports, findings), indent=2)


def render_table(
    reports: Sequence[FileReport], findings: Sequence[Finding] = (), *, verbose: bool = False
) -> str:
    """One block per file (problems as rule, column, rows, message; rows `-` where the rule is not
    row-based), one per run with data-driven findings, then a line of counts.
    `verbose` adds the notes: what the alignment audit compared, sampling, inconclusive checks."""
    blocks = [_file_block(r, verbose) for r in reports]
    runs = sorted({f.run_id for f in findings})
    blocks += [_run_block(run, [f for f in findings if f.run_id == run]) for run in runs]
    return "\n\n".join([*blocks, summary_line(reports, findings)])


def _run_block(run_id: str, findings: Sequence[Finding]) -> str:
    warnings = sum(f.severity == "warning" for f in findings)
    errors = len(findings) - warnings
    lines = [f"run {run_id}  {errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)}"]
    lines += [f"  {line}" for line in findings_lines(findings, with_run=False)]
    return "\n".join(lines)


def findings_lines(findings: Sequence[Finding], with_run: bool = True) -> list[str]:
    """The findings as an aligned table: severity, (run), rule, column, rows, message."""
    header = ("severity", *(("run",) if with_run else ()), "rule", "column", "rows", "message")
    table = [header] + [
        (f.severity, *((f.run_id,) if with_run else ()), f.rule, f.column or "-", f"{f.rows:,}", f.message)
        for f in findings
    ]
    return aligned_lines(table, right={len(header) - 2})


def summary_line(reports: Sequence[FileReport], findings: Sequence[Finding] = ()) -> str:
    c = _counts(reports, findings)
    warnings = f"; {c['warnings']} warning{'s' * (c['warnings'] != 1)}" if c["warnings"] else ""
    return (
        f"{c['files']} file{'s' if c['files'] != 1 else ''}: {c['clean']} clean, "
        f"{c['with_problems']} with problems, {c['unreadable']} unreadable{warnings}"
    )


def _counts(reports: Sequence[FileReport], findings: Sequence[Finding] = ()) -> dict[str, int]:
    return {
        "files": len(reports),
        "clean": sum(r.ok for r in reports),
        "with_problems": sum(r.readable and not r.ok for r in reports),
        "unreadable": sum(not r.readable for r in reports),
        "warnings": sum(f.severity == "warning" for f in findings),
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
