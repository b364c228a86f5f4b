"""Validate token logs against schema v1 (DOMAIN.md sections 4-6): rules in, report objects out.

Every rule is a DuckDB aggregate over `read_parquet(path)`, so a 20M-row file is checked in a few
streaming passes and never loaded into Python:

1. the Parquet footer: required columns, types, `proxaudit.schema_version`;
2. one pass of row rules (nulls, log-prob range, versions, minibatch index, proximal_t pairs);
3. one GROUP BY per abort-resume segment `(run_id, seq_id, minibatch, behave_version)`, rolled up per
   sequence: duplicate rows, `pos` gaps, segment order, proximal_t coverage and `proximal_t_version`;
4. the alignment audit (`evaluator.validate.audit`) on a deterministic sample of sequences;
5. across the files of one call (`evaluator.validate.call`): a token `(run_id, seq_id, minibatch, pos)`
   in more than one file (`evaluator.validate.facts`), the audit pooled over a run's files where one file
   cannot decide, and the data-driven findings per run (`evaluator.validate.findings`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from evaluator.duck import connect, literal
from evaluator.problems import FileReport, Problem, format_key
from evaluator.validate import audit
from evaluator.validate.evidence import Evidence, gather
from evaluator.validate.facts import FileFacts
from evaluator.validate.hints import ADD_SCHEMA_VERSION, cast_hint, unreadable
from evaluator.validate.sequences import sequence_facts, sequence_problems
from schemas.token_log import (
    ASSUMED_ON_POLICY,
    COLUMNS,
    COLUMNS_BY_NAME,
    LOGP_COLUMNS,
    RUN_ID_MAX_BYTES,
    SCHEMA_VERSION_KEY,
    SUPPORTED_SCHEMA_VERSIONS,
    VERSION_COLUMNS,
    VERSIONS_KEY,
    type_name,
)


@dataclass
class CheckedFile:
    """One file's verdict and, when it broke no rule, the facts later stages need."""

    report: FileReport
    facts: FileFacts | None = None
    audit: dict = field(default_factory=dict)
    """The alignment audit's evidence (`evaluator.validate.audit`), for pooling over a run's files."""
    evidence: Evidence | None = None
    """The aggregates of the data-driven findings (`evaluator.validate.evidence`), when the file broke
    no rule."""
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
        return CheckedFile(FileReport(path, None, [Problem("unreadable", None, 0, unreadable(path, error))]))
    problems = _schema_problems(schema, metadata)
    usable = _usable_columns(schema)
    checked = CheckedFile(FileReport(path, n_rows, problems))
    if metadata.get(VERSIONS_KEY) == ASSUMED_ON_POLICY:
        checked.report.notes.append(
            "behave_version assumed = step (imported from a dump without versions): every token at "
            "staleness 0, so the drift is the whole behave -> prox gap, engine mismatch and staleness "
            "together"
        )
    if n_rows == 0:  # valid, and replay ingests it as empty: recorded once, it adds no token
        checked.report.notes.append("empty file: no tokens")
    con = connect()
    try:
        _open_source(con, path)
        problems += _row_problems(con, usable)
        if any(p.rule == "run_id_too_long" for p in problems):
            return checked  # every later pass groups by run_id: a long one costs memory per sequence
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
            checked.evidence, notes = gather(con, usable, n_rows)
            checked.report.notes += notes
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
        import pyarrow.dataset as ds  # here only: it imports pandas (0.3 s)

        con.register("src", ds.dataset(path, format="parquet"))
        return
    source = literal(str(path))
    con.execute(f"CREATE VIEW src AS SELECT * FROM read_parquet({source}, hive_partitioning = false)")


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
            message += cast_hint(name, _kind(found), expected)
            problems.append(Problem("wrong_type", name, 0, message))
    version = metadata.get(SCHEMA_VERSION_KEY.encode())
    supported = ", ".join(sorted(SUPPORTED_SCHEMA_VERSIONS))
    if version is None:
        message = f"no `{SCHEMA_VERSION_KEY}` in the file's key-value metadata (expected one of: {supported})"
        message += f"; {ADD_SCHEMA_VERSION}"
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
    if "run_id" in usable:
        rules.append(
            _RowRule(
                "run_id_too_long",
                "run_id",
                f"strlen(run_id) > {RUN_ID_MAX_BYTES}",
                f"`run_id` at most {RUN_ID_MAX_BYTES} bytes (UTF-8): the store repeats it on every row of "
                "the run's summaries",
                "max(strlen(run_id))",
            )
        )
    for col in (c for c in LOGP_COLUMNS if c in usable):
        rules.append(_RowRule("non_finite_logp", col, f"NOT isfinite({col})", f"`{col}` finite (or null)"))
        rules.append(
            _RowRule("positive_logp", col, f"isfinite({col}) AND {col} > 0", f"`{col}` <= 0", f"max({col})")
        )
    for col in (c for c in ("advantage", "reward") if c in usable):
        rules.append(
            _RowRule(
                "non_finite_value", col, f"NOT isfinite({col})", f"`{col}` finite (or null): the loss uses it"
            )
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
