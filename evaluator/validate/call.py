"""The checks across the files of one call (`proxaudit validate PATHS`, and replay's first phase): find
the files, check each on its own (`evaluator.validate.files`), then a token in two files, the alignment
audit pooled over a run's files, and the data-driven findings per run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.compute as pc

from evaluator.errors import NothingReadableError, UsageError
from evaluator.problems import CheckOutcome, FileReport, Finding, Problem
from evaluator.sources import Staging, is_uri
from evaluator.validate import audit
from evaluator.validate.evidence import pooled
from evaluator.validate.facts import cross_file_duplicates
from evaluator.validate.files import CheckedFile, check_file
from evaluator.validate.findings import run_findings
from evaluator.validate.found import Folder, found_folders, nothing_found


def find_parquet_files(paths: Sequence[str | Path], staging: Staging | None = None) -> list[Path]:
    """The files named in `paths`, with folders searched recursively for `*.parquet`, in order, once each;
    object-storage URIs (a prefix or one object) are copied by `staging` (`evaluator.sources`)."""
    found: dict[Path, None] = {}
    for raw in paths:
        if is_uri(raw):
            if staging is None:
                raise UsageError(f"{raw}: object-storage URIs are read by validate and replay only")
            found.update(dict.fromkeys(staging.stage(str(raw))))
            continue
        path = Path(raw)
        if not path.exists():
            raise UsageError(f"{path}: no such file or folder")
        if path.is_dir():
            found.update(dict.fromkeys(sorted(p for p in path.rglob("*.parquet") if p.is_file())))
        else:
            found[path] = None
    return list(found)


@dataclass
class Judgement:
    """The run-level findings (errors and warnings) of `evaluator.validate.findings` on the files of a
    call, and what every check made of every run (passed, found, undecided and why)."""

    findings: list[Finding]
    checks: list[CheckOutcome]


@dataclass
class Validation:
    """The verdict on the files of one call: a report per file (errors of the call-level checks
    included), the run-level findings and the checks' outcomes."""

    reports: list[FileReport]
    findings: list[Finding]
    checked: list[CheckedFile]
    checks: list[CheckOutcome]
    folders: list[Folder] = field(default_factory=list)
    """Where the files were found, with their runs (`evaluator.validate.found`)."""

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]


def validate_paths(paths: Sequence[str | Path], max_staleness: int | None = None) -> Validation:
    """Validate every Parquet file under `paths`, each on its own and then across the files of each run
    (`judge_call`); raises `NothingReadableError` when there is none. Objects of URIs are read from a
    temporary copy; their reports name the URI."""
    with Staging() as staging:
        files = find_parquet_files(paths, staging)
        if not files:
            raise NothingReadableError(nothing_found(paths))
        folders = found_folders(files, staging)
        checked = [check_file(path) for path in files]
    for c in checked:  # the call-level checks read no file, and their messages name what the user named
        c.report.path = staging.location(c.report.path)
    judgement = judge_call(checked, max_staleness)
    return Validation([c.report for c in checked], judgement.findings, checked, judgement.checks, folders)


def judge_call(
    checked: list[CheckedFile], max_staleness: int | None = None, duplicates: bool = True
) -> Judgement:
    """The checks that need several files, on the files that broke no rule of their own: a token in two
    files (`duplicates`: replay checks against the store instead), the alignment audit pooled over a
    run's files where one file alone was inconclusive, and the data-driven findings per run. An error
    becomes a problem of the run's files (they lose their facts: replay skips them); every finding is
    returned, with every check's outcome per run."""
    clean = [c for c in checked if c.facts is not None]
    if duplicates:
        pairs = [(c.report.path, c.facts) for c in clean]
        for j, problem in cross_file_duplicates(pairs).items():
            clean[j].report.problems.append(problem)
    by_run: dict[str, list[CheckedFile]] = {}
    for c in checked:
        if len(c.run_ids) == 1:
            by_run.setdefault(c.run_ids[0], []).append(c)
    for run_id, files in by_run.items():
        _pooled_audit(run_id, files)
    clean = [c for c in clean if c.report.ok]
    found, outcomes = run_findings(pooled([c.evidence for c in clean]), max_staleness) if clean else ([], [])
    for finding in (f for f in found if f.severity == "error"):
        for c in clean:
            if finding.run_id in c.runs() and _shows(c, finding, max_staleness):
                c.report.problems.append(finding.problem())
    for c in checked:
        if not c.report.ok:
            c.facts = None
    return Judgement(found, outcomes)


def _pooled_audit(run_id: str, files: list[CheckedFile]) -> None:
    """Settle the audit checks a file alone left inconclusive on the evidence of every file of its run
    (the decided ones too: a run's files come from one trainer). A misalignment found so is reported on
    the inconclusive files whose own evidence leans the same way."""
    undecided = [(c, audit.inconclusive(c.audit)) for c in files]
    for check in sorted({check for _, u in undecided for check in u}):
        holders = [c for c, u in undecided if check in u]
        sources = [c for c in files if not isinstance(c.audit.get(check, "none"), str)]
        if len(sources) < 2:
            continue
        pooled_evidence = audit.pool([c.audit[check] for c in sources])
        problems, notes = audit.judge_evidence({check: pooled_evidence})
        shift = audit.best_shift(audit.fit_of(check, pooled_evidence))
        where = f"pooled over {len(sources)} files of run {run_id}"
        for c in holders:
            if problems and audit.best_shift(audit.fit_of(check, c.audit[check])) == shift:
                c.report.problems += [
                    Problem(p.rule, p.column, p.rows, f"{where}: {p.message}") for p in problems
                ]
            c.report.notes += [f"{n} ({where})" for n in notes]


def _shows(c: CheckedFile, finding: Finding, max_staleness: int | None) -> bool:
    """A run-level error belongs to every file of the run, but tokens beyond the maximum staleness to the
    files that hold them."""
    if finding.rule != "staleness_beyond_max":
        return True
    return bool(pc.any(pc.greater(c.evidence.tables["cells"]["staleness"], max_staleness)).as_py())


def require_readable(reports: Sequence[FileReport]) -> None:
    """Raise `NothingReadableError` when no file of `reports` could be read at all."""
    if reports and not any(r.readable for r in reports):
        reasons = "; ".join(f"{r.path}: {r.problems[0].message}" for r in reports)
        raise NothingReadableError(f"none of the {len(reports)} files could be read ({reasons})")
