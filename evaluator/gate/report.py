"""Renderers of a gate result: a terminal table, JUnit XML (one test case per check and run), Markdown
for a CI job summary, and JSON with every field. Pure functions from `GateResult` to text."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from evaluator.gate.judge import GateResult, Verdict
from evaluator.text_table import aligned_lines, column_widths, markdown_code, printable

_MARK = {"pass": "✅ pass", "warn": "⚠️ warn", "fail": "❌ fail", "skip": "⏭️ skip"}


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.6g}"


def threshold_text(v: Verdict) -> str:
    """The conditions of the check, with the baseline's limit once known: '<= 0.05; <= 0.0412 (1.1 x b)'."""
    check = v.check
    parts = []
    if check.min is not None:
        parts.append(f">= {check.min:g}")
    if check.max is not None:
        parts.append(f"<= {check.max:g}")
    if check.max_regression is not None:
        sign = "<=" if check.better == "lower" else ">="
        limit = f"{v.regression_limit:.6g}" if v.regression_limit is not None else "?"
        parts.append(
            f"{sign} {limit} ({check.baseline_run} {'+' if sign == '<=' else '-'}{check.max_regression:.0%})"
        )
    return "; ".join(parts)


def _selection(v: Verdict) -> str:
    if v.check.staleness is None:
        return "all"
    lo, hi = v.check.staleness
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def summary_line(result: GateResult) -> str:
    """'gate FAILED: 2 failed, 1 warning, 7 passed, 0 skipped (10 verdicts)'."""
    status = "passed" if result.passed else "FAILED"
    counts = ", ".join(f"{result.count(v)} {word}" for v, word in _WORDS)
    nothing = "; nothing was judged" if result.judged == 0 else ""
    return f"gate {status}: {counts} ({len(result.verdicts)} verdicts{nothing})"


_WORDS = (("fail", "failed"), ("warn", "warnings"), ("pass", "passed"), ("skip", "skipped"))


def _rows(result: GateResult) -> list[list[str]]:
    return [
        [
            v.check.name,
            v.run_id or "-",
            _num(v.observed),
            threshold_text(v),
            str(v.tokens),
            v.verdict,
            v.reason,
        ]
        for v in result.verdicts
    ]


_HEADER = ["check", "run", "observed", "threshold", "tokens", "verdict", "reason"]


def render_table(result: GateResult) -> str:
    """A plain-text table for the terminal, then the summary line."""
    rows = [_HEADER, *_rows(result)]
    header, *body = aligned_lines(rows, right={2})  # observed values line up on the right
    rule = "  ".join("-" * w for w in [*column_widths(rows)[:-1], len(_HEADER[-1])])
    return "\n".join([header, rule, *body, "", summary_line(result)])


def render_markdown(result: GateResult) -> str:
    """GitHub-flavoured Markdown for `$GITHUB_STEP_SUMMARY`: a status heading, one row per verdict."""

    def cell(text: str, data: bool = False) -> str:  # a pipe ends a table cell, in a code span too
        return (markdown_code(text) if data else printable(text)).replace("|", "\\|")

    lines = [
        f"### proxaudit gate {'✅ passed' if result.passed else '❌ FAILED'}",
        "",
        summary_line(result).split(": ", 1)[1].capitalize()
        + f" on {markdown_code(str(result.db))} with {markdown_code(str(result.thresholds))}.",
        "",
        "| check | run | staleness | observed | threshold | tokens | verdict | reason |",
        "| --- | --- | --- | ---: | --- | ---: | --- | --- |",
    ]
    for v, row in zip(result.verdicts, _rows(result), strict=True):
        name, run, observed, threshold, tokens, verdict, reason = row
        cells = [cell(name, True), cell(run, True), cell(_selection(v)), observed, cell(threshold), tokens]
        lines.append("| " + " | ".join([*cells, _MARK[verdict], cell(reason, True)]) + " |")
    return "\n".join(lines) + "\n"


def verdict_record(v: Verdict) -> dict:
    """Every field of one verdict, JSON-ready (NaN becomes null)."""
    check = v.check

    def clean(x):
        return None if isinstance(x, float) and x != x else x

    return {
        "check_index": check.index,
        "name": check.name,
        "run_id": v.run_id,
        "method": check.method,
        "metric": check.metric,
        "stat": check.stat,
        "figure": check.figure,
        "staleness": list(check.staleness) if check.staleness else None,
        "max": check.max,
        "min": check.min,
        "warn_only": check.warn_only,
        "min_tokens": check.min_tokens,
        "on_insufficient": check.on_insufficient,
        "on_inconclusive": check.on_inconclusive,
        "baseline_run": check.baseline_run,
        "max_regression": check.max_regression,
        "better": check.better if check.max_regression is not None else None,
        "observed": clean(v.observed),
        "observed_lower": clean(v.lower),
        "observed_upper": clean(v.upper),
        "steps_to_decide": v.steps_to_decide,
        "tokens": v.tokens,
        "baseline_value": clean(v.baseline_value),
        "baseline_tokens": v.baseline_tokens,
        "regression_limit": clean(v.regression_limit),
        "threshold": threshold_text(v),
        "verdict": v.verdict,
        "outcome": v.outcome,
        "reason": v.reason,
    }


def render_json(result: GateResult) -> str:
    document = {
        "passed": result.passed,
        "exit_code": result.exit_code,
        "db": result.db,
        "thresholds": result.thresholds,
        "counts": {verdict: result.count(verdict) for verdict in ("pass", "warn", "fail", "skip")},
        "verdicts": [verdict_record(v) for v in result.verdicts],
    }
    return json.dumps(document, indent=2, allow_nan=False) + "\n"


def render_junit(result: GateResult) -> str:
    """JUnit XML: one <testcase> per verdict; failures carry the observed value; warnings and checks not
    selected by --run are <skipped> (type "warning" / "not_selected"); every case has <properties>."""
    n_skipped = result.count("warn") + result.count("skip")
    suites = ET.Element("testsuites", name="proxaudit gate")
    suite = ET.SubElement(
        suites,
        "testsuite",
        name="proxaudit gate",
        tests=str(len(result.verdicts)),
        failures=str(result.count("fail")),
        errors="0",
        skipped=str(n_skipped),
    )
    for v in result.verdicts:
        classname = printable(f"proxaudit.gate.{v.run_id or 'no_run'}")  # XML holds no control chars
        case = ET.SubElement(suite, "testcase", classname=classname, name=printable(v.check.name))
        properties = ET.SubElement(case, "properties")
        for key, value in verdict_record(v).items():
            if value is not None:
                text = json.dumps(value) if isinstance(value, bool | list) else str(value)
                ET.SubElement(properties, "property", name=key, value=printable(text))
        message = printable(
            f"{v.reason} [observed {_num(v.observed)}; threshold {threshold_text(v)}; tokens {v.tokens}]"
        )
        if v.verdict == "fail":
            ET.SubElement(case, "failure", message=message, type=v.outcome).text = message
        elif v.verdict in ("warn", "skip"):
            kind = "warning" if v.verdict == "warn" else v.outcome
            ET.SubElement(case, "skipped", message=f"{v.verdict}: {message}", type=kind)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def write_reports(
    result: GateResult,
    junit: Path | None = None,
    markdown: Path | None = None,
    json_path: Path | None = None,
) -> None:
    """Write the requested report files (parent folders are created)."""
    for path, render in ((junit, render_junit), (markdown, render_markdown), (json_path, render_json)):
        if path is not None:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(render(result), encoding="utf-8")
