"""JUnit XML of a judgement: one test case per run's decision (failing when it is not to ship beyond a
staleness the trainer runs, skipped as `undecided` when it cannot tell yet), then one per check and run;
every case carries its fields as `<properties>`."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from evaluator.gate import Verdict
from evaluator.text_table import printable
from evaluator.verdict.decision import Decision, Judgement
from evaluator.verdict.records import decision_record, observed_text, threshold_text, verdict_record


def _properties(case: ET.Element, record: dict) -> None:
    properties = ET.SubElement(case, "properties")
    for key, value in record.items():
        if value is not None and not isinstance(value, dict | list) or isinstance(value, list) and value:
            text = json.dumps(value) if isinstance(value, bool | list) else str(value)
            ET.SubElement(properties, "property", name=key, value=printable(text))


def _decision_case(suite: ET.Element, d: Decision) -> None:
    case = ET.SubElement(
        suite, "testcase", classname=printable(f"proxaudit.decision.{d.run_id}"),
        name=printable(f"decision on run {d.run_id}"),
    )  # fmt: skip
    record = decision_record(d)
    _properties(case, {k: v for k, v in record.items() if not isinstance(v, dict | list)})
    message = printable(record["sentence"])
    if d.action in ("do_not_ship", "ship_up_to"):
        ET.SubElement(case, "failure", message=message, type=d.action).text = message
    elif d.action == "undecided":
        ET.SubElement(case, "skipped", message=message, type="undecided")


def _check_case(suite: ET.Element, v: Verdict) -> None:
    classname = printable(f"proxaudit.gate.{v.run_id or 'no_run'}")  # XML holds no control chars
    case = ET.SubElement(suite, "testcase", classname=classname, name=printable(v.check.name))
    record = verdict_record(v)
    _properties(case, {k: v for k, v in record.items() if k != "levels"})
    message = printable(
        f"{v.reason} [observed {observed_text(v.observed)}; threshold {threshold_text(v)}; tokens {v.tokens}]"
    )
    if v.verdict == "fail":
        ET.SubElement(case, "failure", message=message, type=v.outcome).text = message
    elif v.verdict in ("warn", "skip"):
        kind = "warning" if v.verdict == "warn" else v.outcome
        ET.SubElement(case, "skipped", message=f"{v.verdict}: {message}", type=kind)


def render_junit(judgement: Judgement) -> str:
    """JUnit XML: the decisions' cases, then one per verdict; failures carry the sentence or the observed
    value; warnings, undecided decisions and checks not selected by --run are <skipped> (type "warning",
    "undecided", "not_selected")."""
    result, decisions = judgement.result, judgement.decisions
    failing = sum(d.action in ("do_not_ship", "ship_up_to") for d in decisions)
    undecided = sum(d.action == "undecided" for d in decisions)
    suites = ET.Element("testsuites", name="proxaudit gate")
    suite = ET.SubElement(
        suites, "testsuite", name="proxaudit gate", tests=str(len(result.verdicts) + len(decisions)),
        failures=str(result.count("fail") + failing), errors="0",
        skipped=str(result.count("warn") + result.count("skip") + undecided),
    )  # fmt: skip
    for d in decisions:
        _decision_case(suite, d)
    for v in result.verdicts:
        _check_case(suite, v)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"
