"""Rendering of validation reports: a readable table (one block per file, one per run) or JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import groupby

from evaluator.problems import CheckOutcome, FileReport, Finding, format_example
from evaluator.text_table import aligned_lines, printable

_HEADER = ("rule", "column", "rows", "message")


def finding_dict(f: Finding) -> dict:
    """A finding with its evidence: {rule, severity, column, rows, message, figure, threshold, examples,
    check}."""
    return {
        "rule": f.rule,
        "severity": f.severity,
        "column": f.column,
        "rows": f.rows,
        "message": f.message,
        "figure": f.figure,
        "threshold": f.threshold,
        "examples": [dict(e) for e in f.examples],
        "check": f.advice,
    }


def report_dict(
    reports: Sequence[FileReport], findings: Sequence[Finding] = (), checks: Sequence[CheckOutcome] = ()
) -> dict:
    """`{"files": [{path, n_rows, ok, readable, problems: [...], notes: [...]}], "runs": [{run_id,
    findings: [{rule, severity, column, rows, message, figure, threshold, examples, check}], checks:
    [{check, status, why}]}], "summary": {...}}`."""
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
    runs = [
        {
            "run_id": run,
            "findings": [finding_dict(f) for f in findings if f.run_id == run],
            "checks": [
                {"check": c.check, "status": c.status, "why": c.why} for c in checks if c.run_id == run
            ],
        }
        for run in _runs(findings, checks)
    ]
    return {"files": files, "runs": runs, "summary": _counts(reports, findings)}


def _runs(findings: Sequence[Finding], checks: Sequence[CheckOutcome]) -> list[str]:
    return sorted({f.run_id for f in findings} | {c.run_id for c in checks})


def render_json(
    reports: Sequence[FileReport], findings: Sequence[Finding] = (), checks: Sequence[CheckOutcome] = ()
) -> str:
    return json.dumps(report_dict(reports, findings, checks), indent=2)


def render_table(
    reports: Sequence[FileReport],
    findings: Sequence[Finding] = (),
    checks: Sequence[CheckOutcome] = (),
    *,
    verbose: bool = False,
) -> str:
    """One block per file (problems as rule, column, rows, message; rows `-` where the rule is not
    row-based), one per run (its findings with their evidence, and the checks that could not decide),
    then a line of counts. `verbose` adds the files' notes (what the alignment audit compared, sampling)
    and the checks that passed."""
    blocks = _stacked([_file_block(r, verbose) for r in reports])
    blocks += [
        _run_block(
            run, [f for f in findings if f.run_id == run], [c for c in checks if c.run_id == run], verbose
        )
        for run in _runs(findings, checks)
    ]
    return "\n\n".join([*blocks, summary_line(reports, findings)])


def _stacked(blocks: list[str]) -> list[str]:
    """The blocks, consecutive one-line blocks (clean files) joined into one: blank lines only around a
    block with something to say."""
    out: list[str] = []
    for one_line, group in groupby(blocks, key=lambda block: "\n" not in block):
        run = list(group)
        out += ["\n".join(run)] if one_line else run
    return out


def _run_block(
    run_id: str, findings: Sequence[Finding], checks: Sequence[CheckOutcome], verbose: bool
) -> str:
    warnings = sum(f.severity == "warning" for f in findings)
    errors = len(findings) - warnings
    by = {s: [c for c in checks if c.status == s] for s in ("passed", "found", "undecided")}
    ran = f"; checks: {len(by['passed'])} passed, {len(by['found'])} found, {len(by['undecided'])} undecided"
    counts = f"{errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)}"
    lines = [f"run {printable(run_id)}  {counts}"]
    lines[0] += ran if checks else ""
    lines += [f"  {line}" for line in findings_lines(findings, with_run=False)]
    shown = by["undecided"] + (by["passed"] if verbose else [])
    if shown:
        lines.append("  checks that could not decide" + (" (and that passed)" if verbose else "") + ":")
        table = [(c.check, c.status, c.why or "-") for c in shown]
        lines += [f"    {line}" for line in aligned_lines(table)]
    return "\n".join(lines)


def findings_lines(findings: Sequence[Finding], with_run: bool = True) -> list[str]:
    """Each finding as a line (severity, (run), rule, column, rows, figure against threshold), then its
    message, examples and what to check in the trainer, indented."""
    header = ("severity", *(("run",) if with_run else ()), "rule", "column", "rows", "figure")
    rows = [
        (
            f.severity,
            *((f.run_id,) if with_run else ()),
            f.rule,
            f.column or "-",
            f"{f.rows:,}",
            f"{f.figure:.4g} ({f.threshold})" if f.figure is not None else f.threshold or "-",
        )
        for f in findings
    ]
    if not rows:
        return []
    head, *body = aligned_lines([header, *rows], right={len(header) - 2})
    lines = [head]
    for f, line in zip(findings, body, strict=True):
        lines.append(line)
        lines.append(f"    {printable(f.message)}.")
        if f.examples:
            lines.append(f"    e.g. {'; '.join(format_example(e) for e in f.examples)}")
        if f.advice:
            lines.append(f"    check: {printable(f.advice)}")
    return lines


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
    lines = [f"{printable(str(report.path))}  ({rows})  {verdict}"]
    if report.problems:
        table = [_HEADER] + [
            (p.rule, p.column or "-", f"{p.rows:,}" if p.rows else "-", p.message) for p in report.problems
        ]
        lines += [f"  {line}" for line in aligned_lines(table, right={2})]  # row counts on the right
    if verbose:
        lines += [f"  note: {printable(note)}" for note in report.notes]
    return "\n".join(lines)
