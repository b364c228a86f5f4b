"""Validate token logs against schema v1 (DOMAIN.md sections 4-6): rules in, report objects out.

Every rule is a DuckDB aggregate over `read_parquet(path)`, so a 20M-row file is checked in a few
streaming passes and never loaded into Python:

1. the Parquet footer: required columns, types, `proxaudit.schema_version`;
2. one pass of row rules (nulls, log-prob range, versions, minibatch index, proximal_t pairs);
3. one GROUP BY per abort-resume segment `(run_id, seq_id, minibatch, behave_version)`, rolled up per
   sequence: duplicate rows, `pos` gaps, segment order, proximal_t coverage and `proximal_t_version`;
4. the alignment audit (`evaluator.audit`) on a deterministic sample of sequences;
5. across the files of one call (`judge_call`): a token `(run_id, seq_id, minibatch, pos)` in more than
   one file (`evaluator.file_facts`), the audit pooled over a run's files where one file cannot decide,
   and the data-driven findings per run (`evaluator.findings`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from evaluator import audit
from evaluator.errors import NothingReadableError, UsageError
from evaluator.evidence import Evidence, gather, pooled
from evaluator.file_facts import FileFacts, cross_file_duplicates
from evaluator.findings import Finding, run_findings
from evaluator.problems import FileReport, Problem, format_key
from evaluator.sources import Staging, is_uri
from evaluator.validate_sequences import sequence_facts, sequence_problems
from schemas.token_log import (
    ASSUMED_ON_POLICY,
    COLUMNS,
    COLUMNS_BY_NAME,
    LOGP_COLUMNS,
    SCHEMA_VERSION_KEY,
    SUPPORTED_SCHEMA_VERSIONS,
    VERSION_COLUMNS,
    VERSIONS_KEY,
    type_name,
)


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
class Validation:
    """The verdict on the files of one call: a report per file (errors of the call-level checks
    included) and the run-level findings (errors and warnings) of `evaluator.findings`."""

    reports: list[FileReport]
    findings: list[Finding]
    checked: list[CheckedFile]

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
            raise NothingReadableError(f"no *.parquet files found in {', '.join(map(str, paths))}")
        checked = [check_file(path) for path in files]
        findings = judge_call(checked, max_staleness)
    for c in checked:
        c.report.path = staging.location(c.report.path)
    return Validation([c.report for c in checked], findings, checked)


def judge_call(
    checked: list[CheckedFile], max_staleness: int | None = None, duplicates: bool = True
) -> list[Finding]:
    """The checks that need several files, on the files that broke no rule of their own: a token in two
    files (`duplicates`: replay checks against the store instead), the alignment audit pooled over a
    run's files where one file alone was inconclusive, and the data-driven findings per run. An error
    becomes a problem of the run's files (they lose their facts: replay skips them); every finding is
    returned."""
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
    found = run_findings(pooled([c.evidence for c in clean]), max_staleness) if clean else []
    for finding in (f for f in found if f.severity == "error"):
        for c in clean:
            if finding.run_id in c.runs() and _shows(c, finding, max_staleness):
                c.report.problems.append(finding.problem())
    for c in checked:
        if not c.report.ok:
            c.facts = None
    return found


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
    return bool(pc.any(pc.greater(c.evidence.cells["staleness"], max_staleness)).as_py())


def require_readable(reports: Sequence[FileReport]) -> None:
    """Raise `NothingReadableError` when no file of `reports` could be read at all."""
    if reports and not any(r.readable for r in reports):
        reasons = "; ".join(f"{r.path}: {r.problems[0].message}" for r in reports)
        raise NothingReadableError(f"none of the {len(reports)} files could be read ({reasons})")


@dataclass
class CheckedFile:
    """One file's verdict and, when it broke no rule, the facts later stages need."""

    report: FileReport
    facts: FileFacts | None = None
    audit: dict = field(default_factory=dict)
    """The alignment audit's evidence (`evaluator.audit`), for pooling over a run's files."""
    evidence: Evidence | None = None
    """The aggregates of the data-driven findings (`evaluator.evidence`), when the file broke no rule."""
    run_ids: list[str] = field(default_factory=list)
    """The runs of a file whose rows and sequences broke no rule (the alignment audit aside)."""

    def runs(self) -> list[str]:
        """The runs of a file that broke no rule."""
        return self.run_ids if self.facts is not None else []


def validate_file(path: Path) -> FileReport:
    """Check one file against every rule; an unreadable file gives one `unreadable` problem saying why."""
    return check_file(path).report


def check_file(path: Path) -> CheckedFile:
    """`validate_file`, keeping the `FileFacts` of a file that broke no rule."""
    path = Path(path)
    try:
        parquet = pq.ParquetFile(path)
        schema, n_rows = parquet.schema_arrow, parquet.metadata.num_rows
        metadata = parquet.metadata.metadata or {}
    except Exception as error:  # pyarrow raises several types for truncated or foreign files
        return CheckedFile(
            FileReport(
                path,
                None,
                [
                    Problem(
                        "unreadable", None, 0, f"cannot open as Parquet (truncated, or not Parquet): {error}"
                    )
                ],
            )
        )
    problems = _schema_problems(schema, metadata)
    usable = _usable_columns(schema)
    checked = CheckedFile(FileReport(path, n_rows, problems))
    if metadata.get(VERSIONS_KEY) == ASSUMED_ON_POLICY:
        checked.report.notes.append(
            "behave_version assumed = step (imported from a dump without versions): every token at "
            "staleness 0, so the drift is the whole behave -> prox gap, engine mismatch and staleness "
            "together"
        )
    if n_rows == 0:
        checked.report.notes.append("empty file: no rows to check")
        return checked
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")  # stderr belongs to the caller
    try:
        _open_source(con, path)
        problems += _row_problems(con, usable)
        problems += sequence_problems(con, usable)
        rows_ok = not problems
        audit_problems, notes, checked.audit = audit.audit_alignment(con, usable, n_rows)
        problems += audit_problems
        checked.report.notes += notes
        if rows_ok:  # the runs too for a file only the audit fails: its run's evidence pools with it
            facts = sequence_facts(con)
            checked.run_ids = sorted(set(facts.sequences["run_id"].to_pylist()))
        if not problems:
            checked.facts = facts
            checked.evidence = gather(con, usable)
    except duckdb.Error as error:
        problems.append(
            Problem("unreadable", None, 0, f"cannot read the data (truncated or corrupt?): {error}")
        )
    finally:
        con.close()
    return checked


def _open_source(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """The view `src` over the file. DuckDB's reader takes `*?[{` as a glob, so such names go through a
    (streaming, slower) pyarrow dataset instead."""
    if any(c in str(path) for c in "*?[{"):
        con.register("src", ds.dataset(path, format="parquet"))
        return
    escaped = str(path).replace("'", "''")
    con.execute(f"CREATE VIEW src AS SELECT * FROM read_parquet('{escaped}', hive_partitioning = false)")


# --- schema ---------------------------------------------------------------------------------------


def _kind(dtype: pa.DataType) -> pa.DataType:
    """The logical type: dictionary-encoded values and every string flavour count as their plain type."""
    if pa.types.is_dictionary(dtype):
        dtype = dtype.value_type
    if pa.types.is_large_string(dtype) or pa.types.is_string_view(dtype):
        return pa.string()
    return dtype


def _family(dtype: pa.DataType) -> str:
    dtype = _kind(dtype)
    for name, test in (("int", pa.types.is_integer), ("float", pa.types.is_floating)):
        if test(dtype):
            return name
    return str(dtype)


def _usable_columns(schema: pa.Schema) -> frozenset[str]:
    """Schema columns that the value rules can read: present, of the right family (int, float, ...)."""
    present = {f.name: f.type for f in schema}
    return frozenset(
        c.name for c in COLUMNS if c.name in present and _family(present[c.name]) == _family(c.type)
    )


def _schema_problems(schema: pa.Schema, metadata: dict[bytes, bytes]) -> list[Problem]:
    problems = []
    present = {f.name: f.type for f in schema}
    for name in (c.name for c in COLUMNS if c.required and c.name not in present):
        problems.append(Problem("missing_column", name, 0, f"required column `{name}` is missing"))
    for name, found in present.items():
        expected = COLUMNS_BY_NAME[name].type if name in COLUMNS_BY_NAME else None
        if expected is not None and _kind(found) != expected:
            message = f"`{name}` is {type_name(found)}, expected {type_name(expected)}"
            problems.append(Problem("wrong_type", name, 0, message))
    version = metadata.get(SCHEMA_VERSION_KEY.encode())
    supported = ", ".join(sorted(SUPPORTED_SCHEMA_VERSIONS))
    if version is None:
        message = f"no `{SCHEMA_VERSION_KEY}` in the file's key-value metadata (expected one of: {supported})"
        problems.append(Problem("schema_version", None, 0, message))
    elif version.decode(errors="replace") not in SUPPORTED_SCHEMA_VERSIONS:
        message = (
            f"`{SCHEMA_VERSION_KEY}` is {version.decode(errors='replace')!r}, expected one of: {supported}"
        )
        problems.append(Problem("schema_version", None, 0, message))
    return problems


# --- row rules (one pass) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _RowRule:
    rule: str
    column: str
    condition: str
    """SQL that is true on a breaking row."""
    expected: str
    """What a correct row has, for the message."""
    worst: str | None = None
    """SQL aggregate over breaking rows that shows the worst value found."""


def _row_rules(usable: frozenset[str]) -> list[_RowRule]:
    rules = [
        _RowRule("null_required", c.name, f"{c.name} IS NULL", f"`{c.name}` is required and never null")
        for c in COLUMNS
        if c.required and c.name in usable
    ]
    for col in (c for c in LOGP_COLUMNS if c in usable):
        rules.append(_RowRule("non_finite_logp", col, f"NOT isfinite({col})", f"`{col}` finite (or null)"))
        rules.append(
            _RowRule("positive_logp", col, f"isfinite({col}) AND {col} > 0", f"`{col}` <= 0", f"max({col})")
        )
    for col in (c for c in VERSION_COLUMNS if c in usable):
        rules.append(
            _RowRule(
                "negative_version",
                col,
                f"{col} < 0",
                f"`{col}` >= 0 (a negative version is AReaL's mark for prompt tokens: prompt positions "
                "leaked into the log; record response tokens only)",
                f"min({col})",
            )
        )
    if {"behave_version", "step"} <= usable:
        rules.append(
            _RowRule(
                "behave_version_after_step",
                "behave_version",
                "behave_version > step",
                "`behave_version` <= `step` (staleness >= 0)",
                "max(behave_version - step)",
            )
        )
    if {"behave_version", "step"} <= usable:
        rules.append(
            _RowRule(
                "staleness_out_of_range",
                "step",
                "step::HUGEINT - behave_version > 2147483647",
                "staleness `step - behave_version` below 2^31 (the store keeps it as a 32-bit integer)",
                "max(step::HUGEINT - behave_version)",
            )
        )
    if "n_minibatches" in usable:
        rules.append(
            _RowRule(
                "n_minibatches_invalid",
                "n_minibatches",
                "n_minibatches < 1",
                "`n_minibatches` >= 1",
                "min(n_minibatches)",
            )
        )
    if {"minibatch", "n_minibatches"} <= usable:
        rules.append(
            _RowRule(
                "minibatch_out_of_range",
                "minibatch",
                "minibatch < 0 OR minibatch >= n_minibatches",
                "0 <= `minibatch` < `n_minibatches`",
            )
        )
    if {"proximal_t_logp", "proximal_t_version"} <= usable:
        rules.append(
            _RowRule(
                "proximal_t_pair",
                "proximal_t_version",
                "(proximal_t_logp IS NULL) <> (proximal_t_version IS NULL)",
                "`proximal_t_logp` and `proximal_t_version` both set or both null on a row",
            )
        )
    return rules


def _row_problems(con: duckdb.DuckDBPyConnection, usable: frozenset[str]) -> list[Problem]:
    """Count the breaking rows of every row rule in one scan; then, for broken rules only, find an
    example row and the worst value."""
    problems = _lone_proximal_t_column(con, usable)
    rules = _row_rules(usable)
    if not rules:
        return problems
    counts = con.execute(f"SELECT {', '.join(f'count_if({r.condition})' for r in rules)} FROM src").fetchone()
    key = ", ".join(f"'{k}': {k}" for k in ("seq_id", "minibatch", "pos") if k in usable)
    for r, count in zip(rules, counts, strict=True):
        if not count:
            continue
        example, worst = con.execute(
            f"SELECT {f'min({{{key}}})' if key else 'NULL'}, {r.worst or 'NULL'} FROM src WHERE {r.condition}"
        ).fetchone()
        found = f"; worst found {worst:g}" if worst is not None else ""
        where = f", e.g. {format_key(example)}" if example else ""
        problems.append(
            Problem(r.rule, r.column, count, f"{count:,} rows break: expected {r.expected}{found}{where}")
        )
    return problems


def _lone_proximal_t_column(con: duckdb.DuckDBPyConnection, usable: frozenset[str]) -> list[Problem]:
    """proximal_t_logp without proximal_t_version (or the reverse) leaves every filled row unpaired."""
    pair = ("proximal_t_logp", "proximal_t_version")
    if sum(c in usable for c in pair) != 1:
        return []
    have, lack = pair if pair[0] in usable else pair[::-1]
    (count,) = con.execute(f"SELECT count({have}) FROM src").fetchone()
    if not count:
        return []
    message = f"{count:,} rows have `{have}` but the file has no `{lack}` column (both or neither)"
    return [Problem("proximal_t_pair", lack, count, message)]
