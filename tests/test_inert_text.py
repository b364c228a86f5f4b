"""Data stays text in every output: a store whose every text is hostile (`tests.hostile`) through every
command that prints, each report format and watch's alerts; and the escaping functions as properties over
any string. The dashboard in a browser: `tests/test_dashboard_browser.py`."""

from __future__ import annotations

import io
import json
import re
import unicodedata
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from evaluator.cli import cli
from evaluator.cli.reading import SUMMARY_VIEWS
from evaluator.text_table import UNSAFE_CATEGORIES, markdown_code, printable, slack_text
from evaluator.watch.alerts import AlertMachine
from evaluator.watch.judge import judge_runs
from evaluator.watch.sinks import Webhook
from tests.hostile import EVIL, FORGED, HOSTILE, hostile_store

# GitHub's renderer: CommonMark with tables and bare URLs and addresses made links (linkify), raw HTML kept
GITHUB = MarkdownIt("commonmark", {"html": True, "linkify": True}).enable(["table", "linkify"])
ACTIVE = re.compile(r"<(a|img|script|iframe|svg|object|embed|form|input|style|link)\b", re.I)


def raw_controls(text: str) -> set[str]:
    """The characters a terminal or a reader would act on, other than the output's own line breaks."""
    return {
        c for c in text if c != "\n" and (unicodedata.category(c) in UNSAFE_CATEGORIES or c in "\ufffe\uffff")
    }


def assert_inert_terminal(text: str, what: str) -> None:
    assert not raw_controls(text), (what, raw_controls(text))
    assert not re.search(rf"\n\s*{FORGED}", text), (what, "a line forged by the data")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return hostile_store(tmp_path_factory.mktemp("hostile"))


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


class TestTerminal:
    def test_gate_and_its_reports(self, store, tmp_path):
        reports = {
            "--junit": tmp_path / "j.xml",
            "--markdown": tmp_path / "g.md",
            "--json": tmp_path / "g.json",
        }
        for thresholds in (None, store.thresholds):
            extra = ["--thresholds", thresholds] if thresholds else []
            code, out = run("gate", "--db", store.db, *extra, *(x for kv in reports.items() for x in kv))
            assert code in (0, 1) and "gate " in out
            assert_inert_terminal(out, f"gate {thresholds}")
            assert HOSTILE.encode("unicode_escape").decode()[:8] in out  # the run, spelled out: r\nFORGED
            markdown_is_inert(reports["--markdown"].read_text())
            junit_carries_the_data(reports["--junit"])
            records = json.loads(reports["--json"].read_text())  # JSON: the data exact, by construction
            assert HOSTILE in strings(records)

    @pytest.mark.parametrize("by", list(SUMMARY_VIEWS))
    def test_summary_every_view(self, store, by):
        code, out = run("summary", "--db", store.db, "--by", by)
        assert code == 0, out
        assert_inert_terminal(out, by)
        code, out = run("summary", "--db", store.db, "--by", by, "--format", "json")
        assert code == 0 and isinstance(json.loads(out), list)

    @pytest.mark.parametrize("table", ["run_finding", "run_check"])
    def test_findings_and_checks_are_shown_spelled_out(self, store, table):
        code, out = run("query", "--db", store.db, f"SELECT * FROM {table}")
        assert code == 0 and out.count(printable(HOSTILE)[:20]) >= 4  # run, rule/check, message/why, ...
        assert_inert_terminal(out, table)

    @pytest.mark.parametrize(
        "args",
        [
            ("validate", "{logs}"),
            ("validate", "-v", "{logs}"),
            ("replay", "{logs}", "--db", "{db}", "--loss", "{loss}"),
            ("loss", "--loss", "{loss}"),
        ],
    )
    def test_every_other_command(self, store, args):
        values = {"logs": store.logs, "db": store.db, "loss": store.loss}
        code, out = run(*(a.format(**values) for a in args))
        assert code in (0, 1), out
        assert_inert_terminal(out, args[0])

    def test_the_demo_prints_the_decisions_and_gate_as_gate_does(self, store):
        from evaluator.verdict import judge_db
        from evaluator.verdict.report import render_decisions, render_table

        judgement = judge_db(store.db, store.thresholds)
        lines = [judgement.loss_line(), *render_decisions(judgement)]  # demo.py prints these, then the gate
        assert all(FORGED in line and not raw_controls(line) and "\n" not in line for line in lines)
        assert_inert_terminal(render_table(judgement, 100), "demo's gate")


class TestWatch:
    def test_the_alert_line_and_the_webhook_text(self, store, monkeypatch):
        posted = []

        def urlopen(request, timeout):
            posted.append(request.data)
            return io.BytesIO(b"ok")

        monkeypatch.setattr("evaluator.watch.sinks.urllib.request.urlopen", urlopen)
        (alert,) = AlertMachine().on_verdicts(judge_runs(store.db), "2026-01-01T00:00:00Z", None)
        line = alert.text()
        assert "\n" not in line and not raw_controls(line) and printable(HOSTILE) in line
        assert Webhook("http://127.0.0.1:9/hook").post(alert) is None
        body = json.loads(posted[0])
        assert body["run_id"] == HOSTILE  # the JSON fields: the data exact
        assert "<" not in body["text"] and ">" not in body["text"]  # no Slack link, mention or date
        assert body["text"].replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&") == line


def strings(value) -> set[str]:
    """Every string in a JSON value."""
    if isinstance(value, dict):
        return set().union(*map(strings, value.values()), set())
    if isinstance(value, list):
        return set().union(*map(strings, value), set())
    return {value} if isinstance(value, str) else set()


def markdown_is_inert(markdown: str) -> None:
    """No link, image or HTML element as GitHub renders the report; the data shown, spelled out."""
    html = GITHUB.render(markdown)
    assert not ACTIVE.search(html), ACTIVE.search(html)
    assert EVIL in html and not raw_controls(markdown)
    rows = [line for line in markdown.splitlines() if line.startswith("| ")]
    widths = {len(re.findall(r"(?<!\\)\|", row)) for row in rows if "---" not in row}
    assert rows and len(widths) <= 2  # no pipe from the data adds a cell (two tables: trainers', checks')


def junit_carries_the_data(path) -> None:
    root = ET.parse(path).getroot()  # well-formed XML 1.0
    texts = [v for e in root.iter() for v in (*e.attrib.values(), e.text or "")]
    assert any(printable(HOSTILE) in t for t in texts)


class TestEscapingProperties:
    @given(st.text())
    def test_printable_leaves_no_control_or_line_break(self, text):
        assert not raw_controls(printable(text)) and "\n" not in printable(text)

    @given(st.text())
    def test_printable_with_lines_keeps_only_the_line_breaks_and_tabs(self, text):
        kept = printable(text, keep_lines=True)
        assert not {c for c in raw_controls(kept) if c != "\t"}
        assert kept.count("\n") == text.count("\n")

    @given(st.text())
    def test_a_markdown_code_span_is_one_code_element_holding_the_text(self, text):
        html = GITHUB.render(f"run {markdown_code(text)} here")
        assert not ACTIVE.search(html.replace("<code>", "").replace("</code>", ""))
        (code,) = re.findall(r"<code>(.*?)</code>", html, re.S)
        shown = code.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&")
        spaces = not printable(text).strip(" ")  # a span of spaces only keeps them all (CommonMark)
        assert shown == (f" {printable(text)} " if spaces else printable(text))  # round trip

    @given(st.text())
    def test_slack_text_has_no_angle_bracket_and_unescapes_to_printable(self, text):
        shown = slack_text(text)
        assert "<" not in shown and ">" not in shown
        assert shown.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&") == printable(text)

    @given(st.text())
    def test_xml_attributes_and_text_round_trip(self, text):
        element = ET.Element("testcase", name=printable(text))
        element.text = printable(text)
        back = ET.fromstring(ET.tostring(element, encoding="unicode"))
        assert back.get("name") == printable(text) and (back.text or "") == printable(text)
