"""Plain text for the terminal and text reports: the one column aligner of `validate`, `summary` and
`gate`; `printable`, which spells out the control and format characters a value from the data may carry;
`markdown_code`, which sets a value from the data as inert Markdown; `slack_text`, a chat message's."""

from __future__ import annotations

import re
import textwrap
import unicodedata
from collections.abc import Container, Sequence

UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
"""Unicode categories `printable` spells out: controls (C0, DEL and C1, where U+009B is a CSI on many
terminals), format characters (bidirectional overrides and isolates that reorder what a line shows, zero
widths, the BOM), line and paragraph separators, lone surrogates (which cannot even be encoded)."""
_SPECIAL = {"\n": "\\n", "\t": "\\t"}
_NOT_XML = "\ufffe\uffff"  # the two noncharacters XML 1.0 forbids besides controls and surrogates
_SUSPECT = re.compile(r"[^\x20-\x7e]")
_SUSPECT_BUT_LINES = re.compile(r"[^\x20-\x7e\n\t]")


def _spelled(match: re.Match) -> str:
    char = match.group()
    if unicodedata.category(char) not in UNSAFE_CATEGORIES and char not in _NOT_XML:
        return char
    code = ord(char)
    return _SPECIAL.get(char) or (
        f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
    )


def printable(text: str, keep_lines: bool = False) -> str:
    """`text` with the characters of `UNSAFE_CATEGORIES` (an escape sequence a run_id smuggles to the
    terminal, a bidi override that makes it read as another, a byte XML cannot hold) written as Python
    writes them (`\\x1b`, `\\x9b`, `\\u202e`); with `keep_lines`, newlines and tabs stay."""
    return (_SUSPECT_BUT_LINES if keep_lines else _SUSPECT).sub(_spelled, text)


def markdown_code(text: str) -> str:
    """`text` as an inline Markdown code span, whose content no Markdown renderer parses (never a link,
    even for a bare URL, an image, HTML or a heading), `printable` first."""
    text = printable(text)
    fence = "`" * (max(map(len, re.findall("`+", text)), default=0) + 1)
    return f"{fence} {text} {fence}"  # CommonMark strips one space on each side of a code span


def slack_text(text: str) -> str:
    """`text` for the `text` of a Slack (or compatible) message: `printable`, then `&`, `<` and `>` escaped
    as Slack asks, so that nothing from the data becomes a link, a mention (`<!channel>`, `<@U1>`) or a
    date token."""
    return printable(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def column_widths(rows: Sequence[Sequence[str]]) -> list[int]:
    """The width of each column: its longest cell."""
    return [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]


def aligned_lines(rows: Sequence[Sequence[str]], right: Container[int] = ()) -> list[str]:
    """Each row as one line: cells padded to their column's width (right-aligned for the column
    indices in `right`, else left), two spaces apart, trailing spaces dropped."""
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = column_widths(rows)
    return [
        "  ".join(
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def fitted_lines(
    rows: Sequence[Sequence[str]], width: int | None, right: Container[int] = (), keep: int = 2
) -> tuple[list[str], list[str]]:
    """(`aligned_lines` of the rows, the names of the columns left out) within `width` characters (None:
    any): the columns past `keep` that do not fit are left out, from the right; a last column of text that
    does not fit is wrapped onto lines of its own instead when at least 30 characters remain for it."""
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = column_widths(rows)
    if width is None or sum(widths) + 2 * (len(widths) - 1) <= width:
        return aligned_lines(rows, right), []
    start = sum(widths[:-1]) + 2 * (len(widths) - 1)
    if width - start >= 30 and len(widths) - 1 not in right:  # wrap the last column
        head = aligned_lines([row[:-1] + [""] for row in rows], right)
        lines = []
        for line, row in zip(head, rows, strict=True):
            pieces = textwrap.wrap(row[-1], width - start) or [""]
            lines.append(line.ljust(start) + pieces[0])
            lines += [" " * start + piece for piece in pieces[1:]]
        return [line.rstrip() for line in lines], []
    kept = keep
    while kept < len(widths) and sum(widths[: kept + 1]) + 2 * kept <= width:
        kept += 1
    return aligned_lines([row[:kept] for row in rows], right), [str(name) for name in rows[0][kept:]]


def wrapped(text: str, width: int | None, indent: int = 2) -> str:
    """`text` with each line longer than `width` wrapped (its next lines indented); as it is for None."""
    if width is None:
        return text
    lines = text.splitlines() or [""]
    return "\n".join(
        piece
        for line in lines
        for piece in (
            textwrap.wrap(line, width, subsequent_indent=" " * indent) if len(line) > width else [line]
        )
    )
