"""Renderers of a judgement (the gate's result and each run's decision): a terminal report, Markdown for a CI
job summary, JSON with every field (`evaluator.verdict.junit`: JUnit XML). Pure functions from
`Judgement` to text. Each opens with the decisions, one sentence per run, then each trainer's own mismatch
figure on the runs (`trainer_mismatch`); each check then shows its verdict beside its requirement (a failed
requirement never reads as a claim), with what was observed."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path

from evaluator.gate import GateResult
from evaluator.store.trainers import TrainerFigure, trainer_sentences
from evaluator.text_table import fitted_lines, markdown_code, printable, wrapped
from evaluator.verdict.decision import Judgement
from evaluator.verdict.junit import render_junit
from evaluator.verdict.records import (
    clean,
    decision_record,
    observed_text,
    selection_text,
    threshold_text,
    verdict_record,
)
from evaluator.verdict.words import run_line

_MARK = {"pass": "✅ pass", "warn": "⚠️ warn", "fail": "❌ fail", "skip": "⏭️ skip"}
ACTION_MARK = {"ship": "✅", "ship_up_to": "⚠️", "do_not_ship": "❌", "undecided": "❔"}
_WORDS = (("fail", "failed"), ("warn", "warnings"), ("pass", "passed"), ("skip", "skipped"))
_HEADER = ["verdict", "requirement", "run", "staleness", "observed", "threshold", "tokens", "reason"]


def summary_line(result: GateResult) -> str:
    """'gate FAILED: 2 failed, 1 warning, 7 passed, 0 skipped (10 verdicts)'."""
    status = "passed" if result.passed else "FAILED"
    counts = ", ".join(f"{result.count(v)} {word}" for v, word in _WORDS)
    nothing = "; nothing was judged" if result.judged == 0 else ""
    return f"gate {status}: {counts} ({len(result.verdicts)} verdicts{nothing})"


def _rows(result: GateResult) -> list[list[str]]:
    return [
        [
            v.verdict.upper() if v.verdict == "fail" else v.verdict, v.check.name, v.run_id or "-",
            selection_text(v), observed_text(v.observed), threshold_text(v), str(v.tokens), v.reason,
        ]
        for v in result.verdicts
    ]  # fmt: skip


TRAINERS_TITLE = (
    "Each trainer's own mismatch figure at staleness 0, against its published line (definitions and "
    "sources: proxaudit summary --by trainers):"
)
_TRAINER_HEADER = ["run", "trainer", "figure", "value", "its line", "", "tokens"]


def _trainer_rows(judgement: Judgement) -> list[list[str]]:
    return [
        [f.run_id, f.trainer, f.metric, f.value_text(), "-" if f.line is None else f"{f.line:g}", f.side(),
         f"{f.n:,}"]
        for f in judgement.trainers
    ]  # fmt: skip


def render_trainers(judgement: Judgement, width: int | None = None) -> list[str]:
    """The trainers' own mismatch figures of the judged runs: a table where it fits `width`, else one
    sentence per run and trainer, wrapped; nothing when no run has a token at staleness 0 with prox_logp."""
    if not judgement.trainers:
        return []
    lines, _ = fitted_lines([_TRAINER_HEADER, *_trainer_rows(judgement)], None, {3, 4, 6})
    if width is not None and max(map(len, lines)) > width:
        lines = [wrapped(printable(line), width) for line in trainer_sentences(list(judgement.trainers))]
        return [wrapped(TRAINERS_TITLE, width), *lines]
    header, *body = lines
    return [wrapped(TRAINERS_TITLE, width), header, "-" * len(header), *body]


def render_decisions(judgement: Judgement, quote: Callable[[str], str] = printable) -> list[str]:
    """The decision on each judged run, one line each (with the engine floor's own verdict)."""
    return [run_line(d, quote) for d in judgement.decisions]


def render_table(judgement: Judgement, width: int | None = None) -> str:
    """The terminal report: the decisions, then the checks, then the summary line, within `width`
    characters (None: any). The checks are a table where it fits; else one block per check: its verdict,
    run and requirement, then why (the observed value, the staleness judged, the threshold, the tokens)."""
    result = judgement.result
    rows = _rows(result)
    lines, _ = fitted_lines([_HEADER, *rows], None, right={6})
    decided = [judgement.loss_line(), *(f"- {line}" for line in render_decisions(judgement))]
    if width is None or max(map(len, lines)) <= width:
        header, *body = lines
        checks = [header, "-" * len(header), *body]
    else:
        checks = []
        for verdict, name, run, staleness, _, threshold, tokens, reason in rows:
            checks += _wrap(f"{verdict.ljust(4)}  {run}: {name}", width, 6)
            checks += _wrap(
                f"{reason} [staleness {staleness}; threshold {threshold}; {tokens} tokens]", width, 6, 6
            )
    trainers = render_trainers(judgement, width)
    return "\n".join(
        [
            wrapped("\n".join(decided), width),
            "",
            *(trainers + [""] if trainers else []),
            *checks,
            "",
            wrapped(summary_line(result), width),
        ]
    )


def _wrap(line: str, width: int, indent: int, first: int = 0) -> list[str]:
    """`line` wrapped to `width`: its first line indented by `first`, the others by `indent`."""
    return textwrap.wrap(
        printable(line), width, initial_indent=" " * first, subsequent_indent=" " * indent
    ) or [""]


def render_markdown(judgement: Judgement) -> str:
    """GitHub-flavoured Markdown for `$GITHUB_STEP_SUMMARY`: a status heading, the decisions, one row per
    verdict. Values from the data (run ids, check names, reasons) are code spans: never a link."""
    result = judgement.result

    def cell(text: str, data: bool = False) -> str:  # a pipe ends a table cell, in a code span too
        return (markdown_code(text) if data else printable(text)).replace("|", "\\|")

    lines = [
        f"### proxaudit gate {'✅ passed' if result.passed else '❌ FAILED'}",
        "",
        *(f"- {ACTION_MARK[d.action]} {run_line(d, markdown_code)}" for d in judgement.decisions),
        "",
        *_markdown_trainers(judgement, cell),
        summary_line(result).split(": ", 1)[1].capitalize()
        + f" on {markdown_code(str(result.db))} with {markdown_code(str(result.thresholds))}.",
        "",
        "| verdict | requirement | run | staleness | observed | threshold | tokens | reason |",
        "| --- | --- | --- | --- | ---: | --- | ---: | --- |",
    ]
    for v, row in zip(result.verdicts, _rows(result), strict=True):
        _, name, run, staleness, observed, threshold, tokens, reason = row
        cells = [_MARK[v.verdict], cell(name, True), cell(run, True), cell(staleness), cell(observed),
                 cell(threshold, v.check.baseline_run is not None), tokens, cell(reason, True)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _markdown_trainers(judgement: Judgement, cell: Callable[..., str]) -> list[str]:
    """The trainers' own mismatch figures as a Markdown table (run ids, trainers and figures as code
    spans), then a blank line; nothing without a figure."""
    if not judgement.trainers:
        return []
    lines = [
        f"**{TRAINERS_TITLE.removesuffix(':')}**",
        "",
        "| run | trainer | figure | value | its line | | tokens |",
        "| --- | --- | --- | ---: | ---: | --- | ---: |",
    ]
    for run, trainer, figure, value, line, side, tokens in _trainer_rows(judgement):
        cells = [cell(run, True), cell(trainer, True), cell(figure, True), value, line, side, tokens]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def trainer_record(f: TrainerFigure) -> dict:
    """One trainer's figure, JSON-ready (NaN becomes null)."""
    keys = ("trainer", "metric", "value", "line", "within_line", "n", "definition", "source")
    return {key: clean(getattr(f, key)) for key in keys}


def render_json(judgement: Judgement) -> str:
    result = judgement.result
    document = {
        "passed": result.passed,
        "exit_code": result.exit_code,
        "db": result.db,
        "thresholds": result.thresholds,
        "counts": {verdict: result.count(verdict) for verdict in ("pass", "warn", "fail", "skip")},
        "decisions": [
            {
                **decision_record(d),
                "trainer_mismatch": [trainer_record(f) for f in judgement.trainers if f.run_id == d.run_id],
            }
            for d in judgement.decisions
        ],
        "verdicts": [verdict_record(v) for v in result.verdicts],
    }
    return json.dumps(document, indent=2, allow_nan=False) + "\n"


def write_reports(
    judgement: Judgement,
    junit: Path | None = None,
    markdown: Path | None = None,
    json_path: Path | None = None,
) -> None:
    """Write the requested report files (parent folders are created)."""
    for path, render in ((junit, render_junit), (markdown, render_markdown), (json_path, render_json)):
        if path is not None:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(render(judgement), encoding="utf-8")
